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


def _from_state(name: str, kind: Any) -> Any:
    """`Annotated[kind, Depends(...)]`: the dependency that reads `app.state.<name>`."""
    async def dependency(request: Request) -> Any:
        return getattr(request.app.state, name)

    dependency.__name__ = f"app_state_{name}"
    return Annotated[kind, Depends(dependency)]


SessionDep = _from_state("session", Any)  # the ViTSession (or one that quacks like it)
BatcherDep = _from_state("batcher", Batcher)
ModelDep = _from_state("model", V2Model)  # what the v2 endpoints serve
LimitsDep = _from_state("limits", Limits)
BudgetDep = _from_state("budget", BodyBudget)
RegistryDep = _from_state("registry", CollectorRegistry)
