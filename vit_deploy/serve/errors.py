"""Errors as answers: `Failure` (raised while reading a request, returned by the batch
worker as one request's result) and the app's exception handlers, registered once by
`make_app`, that turn it and Starlette's HTTPException (unknown paths and methods) into
the same `{"error": "..."}` JSON body for every route."""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

RETRY_AFTER_S = 1


class Failure(Exception):
    """An answer that is an error: HTTP status, a message for the client, extra headers.

    Raised while reading a request; returned (not raised) by the worker as one request's
    result."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def busy(what: str) -> Failure:
    """503 with Retry-After: the server cannot take this request now, because `what`."""
    return Failure(503, f"the server is busy: {what}; retry after {RETRY_AFTER_S} s",
                   {"Retry-After": str(RETRY_AFTER_S)})


def describe(e: BaseException) -> str:
    """'TypeName: message' on one line (for logs and error bodies)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


async def failure_response(request: Request, failure: Failure) -> JSONResponse:
    """Every Failure a route raises: its status, headers and {"error": message}."""
    return JSONResponse({"error": failure.message}, status_code=failure.status,
                        headers=failure.headers)


async def http_error_response(request: Request, e: HTTPException) -> JSONResponse:
    """Unknown paths and methods: the same {"error": ...} body as every other error."""
    return JSONResponse({"error": f"{e.detail}: {request.method} {request.url.path}"},
                        status_code=e.status_code, headers=e.headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(Failure, failure_response)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error_response)  # type: ignore[arg-type]
