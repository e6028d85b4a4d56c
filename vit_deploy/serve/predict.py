"""The server's own API: `POST /predict` (raw image bytes or multipart) -> top-k JSON;
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

from vit_deploy.serve.answer import answer
from vit_deploy.serve.limits import BodyClaim, read_image
from vit_deploy.serve.state import BatcherDep, BudgetDep, LimitsDep, RegistryDep, SessionDep

router = APIRouter()


@router.post("/predict")
async def predict(request: Request, batcher: BatcherDep, budget: BudgetDep,
                  limits: LimitsDep):
    async def submit(claim: BodyClaim) -> asyncio.Future:
        return batcher.submit(await read_image(request, limits, claim))

    async def respond(result: dict[str, Any]) -> Response:
        return JSONResponse(result)

    return await answer(request, "predict", metrics=batcher.metrics, budget=budget,
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
