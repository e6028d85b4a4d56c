"""`vit-deploy serve`: a small HTTP server for one machine, with request batching.

POST /predict (raw image bytes or multipart), GET /health, /metadata, /metrics. Needs the
`serve` extra (FastAPI, uvicorn, python-multipart). FastAPI reads the endpoint
annotations at run time, so this module does not use postponed annotations.

One bad request never harms the next: whatever fails in the batching worker is answered
to the request(s) it belongs to (a bad image: 4xx; a failed session run: 500 for that
batch only), the worker loop itself keeps going, and /health answers 503 if it stopped.
Bodies are counted as they arrive (chunked uploads too), the queue is bounded (503 with
Retry-After when full) and the metrics use fixed memory.
"""

import asyncio
import bisect
import collections
import contextlib
import errno
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from vit_deploy.runtime.preprocess import group_by_shape

log = logging.getLogger(__name__)

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers around the one image
QUEUE_BATCHES = 64  # the queue holds at most this many full batches of requests
RETRY_AFTER_S = 1
LATENCY_WINDOW = 1024  # the most recent latencies kept for percentiles
LATENCY_BUCKETS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
CLIENT_GONE = 499  # nginx's status for "client closed the request"; nobody reads it
SHUTDOWN_GRACE_S = 10  # on Ctrl-C, requests in flight get this long before they are cancelled


class Failure(Exception):
    """An answer that is an error: HTTP status, a message for the client, extra headers.

    Raised while reading a request; returned (not raised) by the worker as one request's
    result."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def _describe(e: BaseException) -> str:
    """'TypeName: message' on one line (for logs and error bodies)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# -- metrics -------------------------------------------------------------------------------


class LatencyStats:
    """Latencies in fixed memory: Prometheus-style cumulative bucket counts over all
    requests, and the last `window` values for percentiles."""

    def __init__(self, window: int = LATENCY_WINDOW,
                 buckets_ms: tuple[float, ...] = LATENCY_BUCKETS_MS):
        if window < 1 or list(buckets_ms) != sorted(set(buckets_ms)):
            raise ValueError(f"need window >= 1 and strictly increasing buckets, got window "
                             f"{window}, buckets {buckets_ms}")
        self.bounds = tuple(buckets_ms)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.count, self.sum_ms = 0, 0.0

    def add(self, ms: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, ms)] += 1  # bucket i holds ms <= bounds[i]
        self.recent.append(ms)
        self.count += 1
        self.sum_ms += ms

    def summary(self) -> dict[str, Any]:
        cumulative = np.cumsum(self.counts).tolist()
        buckets = {f"{b:g}": c for b, c in zip(self.bounds, cumulative)} | {"+Inf": self.count}
        p50 = p90 = p99 = None
        if self.recent:
            p50, p90, p99 = (round(float(v), 3) for v in np.percentile(self.recent, [50, 90, 99]))
        return {"count": self.count, "sum_ms": round(self.sum_ms, 3), "p50": p50, "p90": p90,
                "p99": p99, "window": len(self.recent), "buckets": buckets}


class Metrics:
    """Counters for /metrics; updated from the event loop and the worker thread."""

    def __init__(self, window: int | None = None):
        self.requests = self.images = self.batches = self.max_batch_seen = 0
        self.errors = self.disconnects = self.worker_errors = 0
        self.latency = LatencyStats(window or LATENCY_WINDOW)
        self._lock = threading.Lock()

    def batch(self, size: int) -> None:
        with self._lock:
            self.batches += 1
            self.max_batch_seen = max(self.max_batch_seen, size)

    def success(self, ms: float) -> None:
        with self._lock:
            self.requests += 1
            self.images += 1
            self.latency.add(ms)

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "images": self.images, "batches": self.batches,
                    "max_batch_seen": self.max_batch_seen, "errors": self.errors,
                    "disconnects": self.disconnects, "worker_errors": self.worker_errors,
                    "latency_ms": self.latency.summary()}


# -- the batching worker -------------------------------------------------------------------


@dataclass
class _Job:
    image: bytes
    future: asyncio.Future


class Batcher:
    """Collects requests for up to `max_wait_ms` (or `max_batch` of them) and runs them as
    one session call per same-size group, in a worker thread.

    `start()` and `stop()` run in the serving event loop (the app's lifespan)."""

    def __init__(self, session: Any, *, max_batch: int, max_wait_ms: float, top_k: int,
                 max_queue: int | None = None):
        if max_batch < 1 or max_wait_ms < 0 or (max_queue is not None and max_queue < 1):
            raise ValueError(f"need max_batch >= 1, max_wait_ms >= 0, max_queue >= 1; got "
                             f"{max_batch}, {max_wait_ms}, {max_queue}")
        self.session, self.max_batch, self.max_wait = session, max_batch, max_wait_ms / 1000
        self.top_k = top_k
        self.max_queue = max_queue or QUEUE_BATCHES * max_batch
        self.metrics = Metrics()
        self.preprocess = session.preprocess()
        self.queue: asyncio.Queue | None = None
        self.task: asyncio.Task | None = None

    # event-loop side

    def start(self) -> asyncio.Task:
        self.queue = asyncio.Queue(maxsize=self.max_queue)  # bound to the running loop
        self.task = asyncio.create_task(self.run(), name="vit-deploy batch worker")
        return self.task

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])  # it fails what it held with 503; never raises here

    def stopped(self) -> str | None:
        """Why the worker is not running, or None while it is."""
        task = self.task
        if task is None:
            return "the batch worker has not started"
        if not task.done():
            return None
        if task.cancelled():
            return "the batch worker was cancelled"
        exc = task.exception()
        return f"the batch worker died: {_describe(exc)}" if exc else "the batch worker ended"

    def submit(self, image: bytes) -> asyncio.Future:
        """Queue one image; its future gets a result dict or a Failure. Raises Failure(503)
        when the worker is not running or the queue is full."""
        reason = self.stopped()
        if reason or self.queue is None:
            raise Failure(503, f"not serving: {reason}")
        future = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait(_Job(image, future))
        except asyncio.QueueFull:
            raise Failure(503, f"the server is busy: {self.max_queue} requests are already "
                               f"waiting (the limit); retry after {RETRY_AFTER_S} s",
                          {"Retry-After": str(RETRY_AFTER_S)}) from None
        return future

    async def run(self) -> None:
        """Forever: collect a batch, answer it. A failure costs only the batch it hit."""
        streak = 0  # unexpected errors in a row: back off so a broken loop does not spin
        while True:
            jobs: list[_Job] = []
            try:
                await self._collect(jobs)
                await self._answer(jobs)
                streak = 0
            except asyncio.CancelledError:
                _settle(jobs + self._drain(), Failure(503, "the server is shutting down"))
                raise
            except Exception as e:  # a bug in the loop itself: its batch gets 500, the loop goes on
                streak += 1
                self.metrics.count("worker_errors")
                log.error("batch worker: unexpected %s; %d request(s) answered 500, continuing",
                          _describe(e), len(jobs))
                _settle(jobs, Failure(500, f"internal error in the batch worker: {_describe(e)}"))
                await asyncio.sleep(min(1.0, 0.001 * 2 ** min(streak, 10)))

    async def _collect(self, jobs: list[_Job]) -> None:
        assert self.queue is not None, "start() creates the queue"
        loop = asyncio.get_running_loop()
        jobs.append(await self.queue.get())
        deadline = loop.time() + self.max_wait
        while len(jobs) < self.max_batch:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                jobs.append(await asyncio.wait_for(self.queue.get(), remaining))
            except asyncio.TimeoutError:
                break

    async def _answer(self, jobs: list[_Job]) -> None:
        live = [j for j in jobs if not j.future.done()]  # a client that went away: skipped
        if not live:
            return
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(None, self._predict, [j.image for j in live])
        except Exception as e:  # _predict answers per image and per group; this is a bug there
            self.metrics.count("worker_errors")
            log.error("batch of %d failed outside the session run: %s", len(live), _describe(e))
            results = [Failure(500, f"the batch failed: {_describe(e)}")] * len(live)
        for job, result in zip(live, results):
            _settle([job], result)

    def _drain(self) -> list[_Job]:
        jobs = []
        while self.queue is not None and not self.queue.empty():
            jobs.append(self.queue.get_nowait())
        return jobs

    # worker-thread side

    def _predict(self, images: list[bytes]) -> list[Any]:
        """One result per image: a dict, or a Failure for that image (or its group)."""
        out: list[Any] = [None] * len(images)
        arrays = []
        for i, data in enumerate(images):
            x = self._prepare(data)
            if isinstance(x, Failure):
                out[i] = x
            else:
                arrays.append((i, x))
        for indices, batch in group_by_shape(arrays):
            self.metrics.batch(len(indices))
            for i, result in zip(indices, self._classify(batch, len(indices))):
                out[i] = result
        missing = Failure(500, "internal error: the batch produced no result for this image")
        return [missing if r is None else r for r in out]

    def _prepare(self, data: bytes) -> Any:
        """(C, H, W) array, or a Failure saying why this image cannot be used."""
        try:
            return self.preprocess(data)
        except ValueError as e:  # ImageError is one: not a usable image
            return Failure(400, str(e))
        except Exception as e:  # a decoder that crashes on these bytes: still this image's fault
            log.warning("decoding a %d-byte image raised %s; answered 400", len(data),
                        _describe(e))
            return Failure(400, f"image could not be decoded: {_describe(e)}")

    def _classify(self, batch: np.ndarray, n: int) -> list[Any]:
        """n result dicts, or n times the same Failure(500) if the session run failed."""
        try:
            rows = self.session.classify(batch, self.top_k)
            if len(rows) != n:
                raise RuntimeError(f"session returned {len(rows)} results for {n} images")
            return [{"top": [asdict(c) for c in top], "batch_size": n,
                     "provider": self.session.providers[0]} for top in rows]
        except Exception as e:  # the run failed: only this group's requests hear of it
            log.error("inference failed for a batch of %d: %s", n, _describe(e))
            return [Failure(500, f"inference failed: {_describe(e)}")] * n


def _settle(jobs: list[_Job], result: Any) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_result(result)


# -- requests ------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The body, counted chunk by chunk: Failure(413) as soon as it passes `limit` bytes,
    whatever content-length said (or did not say, for a chunked upload)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Failure(413, f"image is over the limit of {limit} bytes (got {size} bytes "
                               f"so far)")
        chunks.append(chunk)
    return b"".join(chunks)


async def _replay(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _multipart_image(request: Request) -> bytes:
    body = await read_body(request, MAX_IMAGE_BYTES + MULTIPART_OVERHEAD)
    try:
        form = await MultiPartParser(request.headers, _replay(body), max_files=1,
                                     max_fields=16).parse()
    except MultiPartException as e:
        raise Failure(400, f"bad multipart body ({e.message}): send exactly one file "
                           f"part") from None
    try:
        files = [v for v in form.values() if isinstance(v, UploadFile)]
        if len(files) != 1:
            raise Failure(400, f"send exactly one file part, got {len(files)}")
        return await files[0].read()
    finally:
        await form.close()


def _declared_length(request: Request) -> int | None:
    text = request.headers.get("content-length")
    if text is None:
        return None
    if not text.strip().isdigit():
        raise Failure(400, f"content-length must be a number of bytes, got {text!r}")
    return int(text)


async def read_image(request: Request) -> bytes:
    """The image bytes of a /predict request, or Failure(4xx) saying what was wrong."""
    length = _declared_length(request)
    if length is not None and length > MAX_IMAGE_BYTES + MULTIPART_OVERHEAD:
        raise Failure(413, f"image of {length} bytes is over the limit of {MAX_IMAGE_BYTES}")
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        data = await _multipart_image(request)
    elif ctype.startswith(("image/", "application/octet-stream")):
        data = await read_body(request, MAX_IMAGE_BYTES)
    else:
        raise Failure(415, f"content type must be an image/*, application/octet-stream or "
                           f"multipart/form-data, got {ctype or 'none'!r}")
    if len(data) > MAX_IMAGE_BYTES:
        raise Failure(413, f"image of {len(data)} bytes is over the limit of {MAX_IMAGE_BYTES}")
    if not data:
        raise Failure(400, "empty request body: send an image")
    return data


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_for_result(request: Request, future: asyncio.Future) -> Any:
    """The future's result, or None if the client went away first. A future left behind
    is cancelled, so the worker skips it and its batch-mates are unaffected."""
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait([future, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is cancelled (server shutdown)
        gone.cancel()
        if not future.done():
            future.cancel()
    return None if future.cancelled() else future.result()


def _absorb_cancellation() -> None:
    """Answering instead of re-raising CancelledError: undo the cancel request's count
    (Python 3.11+ keeps one; asyncio.timeout and TaskGroup read it)."""
    uncancel = getattr(asyncio.current_task(), "uncancel", None)
    if uncancel is not None:
        uncancel()


# -- the app -------------------------------------------------------------------------------


def make_app(session: Any, *, max_batch: int = 8, max_wait_ms: float = 5.0, top_k: int = 5,
             max_queue: int | None = None) -> FastAPI:
    """A FastAPI app: POST /predict, GET /health, /metadata, /metrics.

    At most `max_queue` requests wait (default 64 batches' worth); more get 503."""
    batcher = Batcher(session, max_batch=max_batch, max_wait_ms=max_wait_ms, top_k=top_k,
                      max_queue=max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.task = batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="vit-deploy", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.batcher = batcher

    def error(failure: Failure) -> JSONResponse:
        batcher.metrics.count("errors")
        return JSONResponse({"error": failure.message}, status_code=failure.status,
                            headers=failure.headers)

    def client_gone() -> Response:
        batcher.metrics.count("disconnects")
        log.debug("client disconnected before its answer")
        return Response(status_code=CLIENT_GONE)

    @app.post("/predict")
    async def predict(request: Request):
        t0 = time.perf_counter()
        try:
            future = batcher.submit(await read_image(request))
        except Failure as f:
            return error(f)
        except ClientDisconnect:
            return client_gone()
        try:
            result = await wait_for_result(request, future)
        except asyncio.CancelledError:  # uvicorn cancels handlers only when shutting down
            _absorb_cancellation()  # answered instead: a 503, not a traceback
            return error(Failure(503, "the server is shutting down"))
        if result is None:
            return client_gone()
        if isinstance(result, Failure):
            return error(result)
        batcher.metrics.success((time.perf_counter() - t0) * 1000)
        return result

    @app.get("/health")
    async def health():
        reason = batcher.stopped()
        if reason:
            return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
        return {"status": "ok", "providers": session.providers}

    @app.get("/metadata")
    async def metadata():
        if session.manifest is not None:
            return JSONResponse(json.loads(session.manifest.to_json()))
        return {"config": session.config.to_dict() if session.config else None}

    @app.get("/metrics")
    async def metrics():
        return batcher.metrics.snapshot() | {
            "max_batch": max_batch, "max_wait_ms": max_wait_ms,
            "queue_depth": batcher.queue.qsize() if batcher.queue else 0,
            "max_queue": batcher.max_queue}

    return app


# -- running it ----------------------------------------------------------------------------


class BindError(OSError):
    """The server cannot listen where asked: the address, and why (errno kept)."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _bind_reason(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"port {port} is already in use on {host} (stop what uses it or pick another port)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine"
    if e.errno == errno.EACCES:
        return f"permission denied for port {port} (ports below 1024 need privileges)"
    return e.strerror or str(e)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (port 0: any free one). BindError (an OSError)
    saying which address and why when that is not possible."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise BindError(e.errno, f"cannot serve on {host}:{port}: {host!r} is not a host name "
                                 f"or address this machine can resolve ({e.strerror})") from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # from here on, connections wait in the backlog until uvicorn runs
    except OSError as e:
        sock.close()
        raise BindError(e.errno, f"cannot serve on {host}:{port}: "
                                 f"{_bind_reason(host, port, e)}") from e
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(app: Any, host: str, port: int, *, on_ready: Callable[[str], None],
          log_level: str = "warning") -> None:
    """Bind host:port first (BindError, an OSError, before anything else happens), then
    call `on_ready(url)` (the real port when `port` is 0), then run uvicorn on that socket
    until it is stopped (Ctrl-C / SIGTERM in the main thread)."""
    sock = bind(host, port)
    try:
        on_ready(url_of(sock, host))
        server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on",
                                               timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
        server.run(sockets=[sock])
        if not server.started:
            raise RuntimeError("the server did not start (its log above says why)")
    finally:
        sock.close()
