"""The server's own API: `POST /predict` (raw image bytes or multipart) -> top-k JSON
(a backbone without a classifier: 400, naming /embed); `POST /embed` -> the image's vector;
`GET /health`, `/metadata` (the manifest), `/stats` (counters and latency percentiles as
JSON), `/metrics` (the Prometheus text format). Errors are raised as Failure; the app's
handler answers them."""

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from vit_deploy.runtime.embedding import not_a_classifier, purpose_of
from vit_deploy.serve.answer import answer
from vit_deploy.serve.errors import Failure
from vit_deploy.serve.limits import BodyClaim, read_image
from vit_deploy.serve.state import BatcherDep, BudgetDep, LimitsDep, RegistryDep, SessionDep

router = APIRouter()


@router.post("/predict")
async def predict(request: Request, batcher: BatcherDep, budget: BudgetDep,
                  limits: LimitsDep, session: SessionDep):
    backbone = not_a_classifier(session)

    async def submit(claim: BodyClaim) -> asyncio.Future:
        if backbone is not None:  # a softmax over embedding dimensions is no answer
            raise Failure(400, str(backbone).replace("embed()", "POST /embed", 1))
        return batcher.submit(await read_image(request, limits, claim))

    async def respond(result: dict[str, Any]) -> Response:
        return JSONResponse(result)

    return await answer(request, "predict", metrics=batcher.metrics, budget=budget,
                        submit=submit, respond=respond)


@router.post("/embed")
async def embed(request: Request, batcher: BatcherDep, budget: BudgetDep,
                limits: LimitsDep, session: SessionDep):
    """One image (raw bytes or multipart) -> its embedding: the bundle's embedding output
    (`pooled`), unit length, with its dimension and similarity (cosine)."""
    purpose = purpose_of(session)
    name = purpose.embedding

    async def submit(claim: BodyClaim) -> asyncio.Future:
        if name is None:
            raise Failure(400, f"this model has no embedding output (outputs: "
                               f"{session.output_names}); export with --outputs pooled")
        return batcher.submit_embed(await read_image(request, limits, claim))

    async def respond(result: dict[str, Any]) -> Response:
        return JSONResponse(result)

    return await answer(request, "embed", metrics=batcher.metrics, budget=budget,
                        submit=submit, respond=respond)


@router.get("/health")
async def health(batcher: BatcherDep, session: SessionDep):
    reason = batcher.stopped()
    if reason:
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
    return {"status": "ok", "providers": session.providers}


@router.get("/metadata")
async def metadata(session: SessionDep):
    if session.manifest is not None:
        return JSONResponse(json.loads(session.manifest.to_json()))
    return {"config": session.config.to_dict() if session.config else None}


@router.get("/stats")
async def stats(batcher: BatcherDep):
    return batcher.metrics.snapshot() | {
        "max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_ms,
        "queue_depth": batcher.queue_depth(), "max_queue": batcher.max_queue}


@router.get("/metrics")
async def metrics(registry: RegistryDep):
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
