"""`make_app`: one FastAPI app for one session, its routers (`predict`: the server's own
API; `v2`: the Open Inference Protocol), its state (what the routers' dependencies hand
out), the exception handlers that answer every route's errors, and a lifespan that runs
the batch worker."""

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import FastAPI

from vit_deploy.serve import predict, v2
from vit_deploy.serve.batcher import Batcher
from vit_deploy.serve.errors import install_error_handlers
from vit_deploy.serve.limits import BodyBudget, Limits, largest_checked_side
from vit_deploy.serve.metrics import collector_registry
from vit_deploy.triton import V2Model, model_metadata, model_name


def serving_model(session: Any, name: str | None = None) -> V2Model:
    """The v2 model this session serves: `model_metadata` of its manifest under `name`
    (default: the bundle directory's name, as `vit-deploy triton` names it). ValueError if
    the session has no manifest, or its model file does not have the manifest's tensors."""
    if session.manifest is None:
        raise ValueError("serving needs a bundle directory (its manifest says how to "
                         "preprocess and what the tensors are), not a bare .onnx file")
    model = model_metadata(session.manifest, model_name(name, session.model_path.parent))
    if [t.name for t in model.inputs] != [session.input_name] or \
            sorted(t.name for t in model.outputs) != sorted(session.output_names):
        raise ValueError(f"{str(session.model_path)!r} has input {session.input_name!r} and "
                         f"outputs {session.output_names}, but the manifest lists "
                         f"{[t.name for t in model.inputs]} and "
                         f"{[t.name for t in model.outputs]}")
    return model


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The batch worker runs in the serving event loop, from start-up to shutdown."""
    batcher: Batcher = app.state.batcher
    app.state.task = batcher.start()
    try:
        yield
    finally:
        await batcher.stop()


def make_app(session: Any, *, max_batch: int = 8, max_wait_ms: float = 5.0, top_k: int = 5,
             max_queue: int | None = None, model_name: str | None = None,
             max_infer_bytes: int | None = None, limits: Limits | None = None) -> FastAPI:
    """A FastAPI app: POST /predict, GET /health, /metadata, /stats, /metrics (Prometheus
    text), and the v2 endpoints for the session's model (named `model_name`, default the
    bundle directory's name).

    At most `max_queue` requests wait (default 64 batches' worth); more get 503. `limits`
    (default `Limits()`; `max_infer_bytes` overrides its field) bound what a request may
    cost; `serve` reads the connection limits from `app.state.limits`."""
    limits = limits or Limits()
    if max_infer_bytes is not None:
        limits = replace(limits, max_infer_bytes=max_infer_bytes,
                         max_body_bytes=max(limits.max_body_bytes, max_infer_bytes))
    if limits.max_side is None and (side := largest_checked_side(
            getattr(session, "manifest", None))) is not None:
        limits = replace(limits, max_side=side)
    model = serving_model(session, model_name)
    batcher = Batcher(session, max_batch=max_batch, max_wait_ms=max_wait_ms, top_k=top_k,
                      max_queue=max_queue)
    app = FastAPI(title="vit-deploy", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=_lifespan)
    app.state.session = session
    app.state.batcher = batcher
    app.state.model = model
    app.state.limits = limits
    app.state.budget = BodyBudget(limits.max_bodies, limits.max_body_bytes)
    app.state.registry = collector_registry(batcher)
    install_error_handlers(app)
    app.include_router(predict.router)
    app.include_router(v2.router)
    return app
