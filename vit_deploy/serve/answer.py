"""The life of one inference request, for both protocols: claim a share of the body
budget, read and submit the request, wait for the batch worker (or for the client to go
away), respond; counted in the metrics under its endpoint whatever happens. A Failure is
counted here and raised on to the app's exception handler, which answers it."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from vit_deploy.serve.connections import TIMED_OUT
from vit_deploy.serve.errors import Failure
from vit_deploy.serve.limits import BodyBudget, BodyClaim
from vit_deploy.serve.metrics import CLIENT_GONE, Metrics

log = logging.getLogger(__name__)


async def answer(request: Request, endpoint: str, *, metrics: Metrics, budget: BodyBudget,
                 submit: Callable[[BodyClaim], Awaitable[asyncio.Future]],
                 respond: Callable[[Any], Awaitable[Response]]) -> Response:
    """Submit (reading the request under a claim on the body budget: its bytes as they
    arrive, a parsing slot once all have), wait for the batch worker, respond; every
    failure answered to this request and counted under `endpoint`. The claim's bytes are
    held until the answer."""
    t0 = time.perf_counter()
    claim: BodyClaim | None = None
    try:
        claim = budget.claim()
        try:
            future = await submit(claim)
        finally:
            claim.parsed()
        result = await wait_for_result(request, future)
        if result is None:
            return _client_gone(request, endpoint, metrics)
        if isinstance(result, Failure):  # the worker's answer, maybe shared by a whole batch:
            raise Failure(result.status, result.message, result.headers)  # raise our own
        response = await respond(result)
    except Failure as f:
        metrics.answered(endpoint, f.status)
        raise
    except ClientDisconnect:
        return _client_gone(request, endpoint, metrics)
    except asyncio.CancelledError:  # uvicorn cancels handlers only when shutting down
        absorb_cancellation()  # answered instead (a 503), not a traceback: a cancelled read too
        metrics.answered(endpoint, 503)
        raise Failure(503, "the server is shutting down") from None
    finally:
        if claim is not None:
            claim.release()
    metrics.answered(endpoint, 200, (time.perf_counter() - t0) * 1000)
    return response


def _client_gone(request: Request, endpoint: str, metrics: Metrics) -> Response:
    """The connection is gone: the client left, or the server closed it (a timeout,
    already answered 408 by the connection itself)."""
    status = 408 if request.scope.get(TIMED_OUT) else CLIENT_GONE
    metrics.answered(endpoint, status)
    log.debug("connection gone before its answer (%d)", status)
    return Response(status_code=status)


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_for_result(request: Request, future: asyncio.Future) -> Any:
    """The future's result, or None if the client went away first. A future left behind
    is cancelled, so the worker skips it and its batch-mates are unaffected."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([future, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is cancelled (server shutdown)
        gone.cancel()
        if not future.done():
            future.cancel()
    return None if future.cancelled() else future.result()


def absorb_cancellation() -> None:
    """Answering instead of re-raising CancelledError: undo the cancel request's count
    (Python 3.11+ keeps one; asyncio.timeout and TaskGroup read it)."""
    uncancel = getattr(asyncio.current_task(), "uncancel", None)
    if uncancel is not None:
        uncancel()
