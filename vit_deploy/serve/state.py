"""What the routers share, as FastAPI dependencies: `make_app` keeps one app's state on
`app.state` (the session, the batcher, the v2 model, the limits, the body budget, the
metrics registry) and a route names what it needs by one of the types below, e.g.
`async def health(batcher: BatcherDep)`. The dependencies are coroutines, so FastAPI calls
them in the event loop (a plain function would cost a thread pool hop per request).

FastAPI reads the annotations at run time: no postponed annotations in the routers."""

from typing import Annotated, Any

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry

from vit_deploy.serve.batcher import Batcher
from vit_deploy.serve.limits import BodyBudget, Limits
from vit_deploy.triton import V2Model


async def _session(request: Request) -> Any:
    return request.app.state.session


async def _batcher(request: Request) -> Batcher:
    return request.app.state.batcher


async def _model(request: Request) -> V2Model:
    return request.app.state.model


async def _limits(request: Request) -> Limits:
    return request.app.state.limits


async def _budget(request: Request) -> BodyBudget:
    return request.app.state.budget


async def _registry(request: Request) -> CollectorRegistry:
    return request.app.state.registry


SessionDep = Annotated[Any, Depends(_session)]  # the ViTSession (or one that quacks like it)
BatcherDep = Annotated[Batcher, Depends(_batcher)]
ModelDep = Annotated[V2Model, Depends(_model)]  # what the v2 endpoints serve
LimitsDep = Annotated[Limits, Depends(_limits)]
BudgetDep = Annotated[BodyBudget, Depends(_budget)]
RegistryDep = Annotated[CollectorRegistry, Depends(_registry)]
