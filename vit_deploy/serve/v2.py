"""The Open Inference Protocol (KServe v2 REST, what Triton and KServe speak): `GET /v2`,
`/v2/health/live`, `/v2/health/ready`, `/v2/models/NAME[/versions/1]`, `.../ready`, and
`POST /v2/models/NAME[/versions/1]/infer` with JSON tensors or the binary tensor data
extension; raw pixels in, raw outputs out. Errors are raised as Failure; the app's handler
answers them as `{"error": "..."}`."""

import asyncio
from importlib import metadata as _metadata
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from vit_deploy.runtime.session import InputError
from vit_deploy.serve.answer import answer
from vit_deploy.serve.batcher import Batcher
from vit_deploy.serve.codec import HEADER_LENGTH, InferRequest, encode_infer_response, \
    parse_infer_request, read_infer_body
from vit_deploy.serve.errors import Failure
from vit_deploy.serve.limits import BodyClaim
from vit_deploy.serve.state import BatcherDep, BudgetDep, LimitsDep, ModelDep, SessionDep
from vit_deploy.triton import MODEL_VERSION, V2Model

router = APIRouter(prefix="/v2")


def _version() -> str:
    try:
        return _metadata.version("vit-deploy")
    except _metadata.PackageNotFoundError:
        return "unknown"


def _find_model(model: V2Model, name: str, version: str | None) -> None:
    if name != model.name:
        raise Failure(404, f"unknown model {name!r}: this server serves {model.name!r}")
    if version is not None and version != MODEL_VERSION:
        raise Failure(404, f"model {name!r} has no version {version!r}: it has "
                           f"{list(model.versions)}")


def _readiness(batcher: Batcher, **fields: Any) -> JSONResponse:
    """200 {"ready": true}, or 503 with the reason the batch worker stopped."""
    reason = batcher.stopped()
    return JSONResponse(fields | {"ready": reason is None}
                        | ({"reason": reason} if reason else {}),
                        status_code=503 if reason else 200)


@router.get("")
async def v2_server():
    return {"name": "vit-deploy", "version": _version(), "extensions": ["binary_tensor_data"]}


@router.get("/health/live")
async def v2_live(batcher: BatcherDep):
    reason = batcher.stopped()  # a dead worker is worth a restart: not live
    return JSONResponse({"live": reason is None} | ({"reason": reason} if reason else {}),
                        status_code=503 if reason else 200)


@router.get("/health/ready")
async def v2_ready(batcher: BatcherDep):
    return _readiness(batcher)


@router.get("/models/{name}")
@router.get("/models/{name}/versions/{version}")
async def v2_model(name: str, model: ModelDep, version: str | None = None):
    _find_model(model, name, version)
    return model.to_dict()


@router.get("/models/{name}/ready")
@router.get("/models/{name}/versions/{version}/ready")
async def v2_model_ready(name: str, model: ModelDep, batcher: BatcherDep,
                         version: str | None = None):
    _find_model(model, name, version)
    return _readiness(batcher, name=model.name)


@router.post("/models/{name}/infer")
@router.post("/models/{name}/versions/{version}/infer")
async def v2_infer(name: str, request: Request, model: ModelDep, batcher: BatcherDep,
                   budget: BudgetDep, limits: LimitsDep, session: SessionDep,
                   version: str | None = None):
    parsed: list[InferRequest] = []

    async def submit(claim: BodyClaim) -> asyncio.Future:
        _find_model(model, name, version)
        body = await read_infer_body(request, limits.max_infer_bytes, claim)
        got = await asyncio.to_thread(parse_infer_request, body,
                                      request.headers.get(HEADER_LENGTH), model,
                                      max_batch=batcher.max_batch, limits=limits)
        del body  # the arrays are what is held from here
        pixels = next(iter(got.inputs.values()))  # serving_model: the one input
        try:
            pixels = session.validate_input(pixels)
        except InputError as e:
            raise Failure(400, f"input {model.inputs[0].name!r}: {e}") from None
        parsed.append(got)
        return batcher.submit_tensor(pixels, tuple(n for n, _ in got.outputs))

    async def respond(result: dict[str, np.ndarray]) -> Response:
        body, headers = await asyncio.to_thread(encode_infer_response, model, parsed[0],
                                                result)
        return Response(body, headers=headers)

    return await answer(request, "v2", metrics=batcher.metrics, budget=budget,
                        submit=submit, respond=respond)
