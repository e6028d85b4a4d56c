"""`vit-deploy serve`: a small HTTP server for one machine, with request batching.

Two APIs over one request batcher:

- `POST /predict` (raw image bytes or multipart) -> top-k JSON; `GET /health`, `/metadata`
  (the manifest), `/stats` (counters and latency percentiles as JSON).
- The Open Inference Protocol (KServe v2 REST, what Triton and KServe speak): `GET /v2`,
  `/v2/health/live`, `/v2/health/ready`, `/v2/models/NAME[/versions/1]`, `.../ready`, and
  `POST /v2/models/NAME[/versions/1]/infer` with JSON tensors or the binary tensor data
  extension (`Inference-Header-Content-Length`); raw pixels in, raw outputs out, errors as
  `{"error": "..."}`. The model name, tensor names, datatypes and shapes are
  `vit_deploy.triton.model_metadata`'s: the ones `vit-deploy triton` writes into config.pbtxt.

`GET /metrics` is the Prometheus text format (requests by endpoint and status, a latency
histogram, batch sizes, queue depth). Needs the `serve` extra (FastAPI, uvicorn,
python-multipart, prometheus-client). FastAPI reads the endpoint annotations at run time,
so this module does not use postponed annotations.

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
import math
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from importlib import metadata as _metadata
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from vit_deploy.runtime.preprocess import group_by_shape
from vit_deploy.runtime.session import InputError
from vit_deploy.triton import MODEL_VERSION, V2_DATATYPES, V2Model, model_metadata, model_name

log = logging.getLogger(__name__)

MAX_IMAGE_BYTES = 20 * 1024 * 1024
# A v2 infer body (after any Content-Encoding): a batch of 8 3x448x448 FP32 images is 19 MB
# binary, about 55 MB as JSON numbers. Over this: 413.
MAX_INFER_BYTES = 64 * 1024 * 1024
HEADER_LENGTH = "inference-header-content-length"  # the binary tensor data extension
ENDPOINTS = ("predict", "v2")  # the inference endpoints the metrics count, by label
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
    """Counters for /stats and /metrics, in fixed memory (responses are counted per
    endpoint and status code, batch sizes per size up to the max batch); updated from the
    event loop and the worker thread."""

    def __init__(self, window: int | None = None):
        self.requests = self.images = self.batches = self.max_batch_seen = 0
        self.errors = self.disconnects = self.worker_errors = 0
        self.latency = {e: LatencyStats(window or LATENCY_WINDOW) for e in ENDPOINTS}
        self.responses: collections.Counter[tuple[str, int]] = collections.Counter()
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()

    def batch(self, size: int) -> None:
        """One session run of `size` images."""
        with self._lock:
            self.batches += 1
            self.images += size
            self.max_batch_seen = max(self.max_batch_seen, size)
            self.batch_sizes[size] += 1

    def answered(self, endpoint: str, status: int, ms: float | None = None) -> None:
        """One inference request answered; `ms` (arrival to answer) for a success."""
        with self._lock:
            self.responses[(endpoint, status)] += 1
            if status == 200:
                self.requests += 1
                self.latency[endpoint].add(ms or 0.0)
            elif status == CLIENT_GONE:
                self.disconnects += 1
            else:
                self.errors += 1

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "images": self.images, "batches": self.batches,
                    "max_batch_seen": self.max_batch_seen, "errors": self.errors,
                    "disconnects": self.disconnects, "worker_errors": self.worker_errors,
                    "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                    "responses": {e: {str(code): n for (e2, code), n in
                                      sorted(self.responses.items()) if e2 == e}
                                  for e in ENDPOINTS},
                    "latency_ms": {e: stats.summary() for e, stats in self.latency.items()}}

    def families(self, *, max_batch: int, queue_depth: int, max_queue: int,
                 up: bool) -> list[Any]:
        """The Prometheus metric families (what /metrics writes as text)."""
        with self._lock:
            requests = CounterMetricFamily(
                "vit_deploy_requests", "Inference requests answered, by endpoint and HTTP "
                "status (499: the client went away first)", labels=["endpoint", "code"])
            for (endpoint, code), n in sorted(self.responses.items()):
                requests.add_metric([endpoint, str(code)], n)
            latency = HistogramMetricFamily(
                "vit_deploy_request_duration_seconds", "Successful inference requests, from "
                "arrival to answer", labels=["endpoint"])
            for endpoint, stats in self.latency.items():
                cumulative = np.cumsum(stats.counts).tolist()
                buckets = [(f"{b / 1000:g}", c) for b, c in zip(stats.bounds, cumulative)]
                latency.add_metric([endpoint], buckets + [("+Inf", stats.count)],
                                   sum_value=stats.sum_ms / 1000)
            bounds = sorted({2 ** i for i in range(max_batch.bit_length()) if 2 ** i <= max_batch}
                            | {max_batch})
            sizes = HistogramMetricFamily("vit_deploy_batch_size",
                                          "Images per session run (one batch)")
            sizes.add_metric([], [(str(b), sum(n for k, n in self.batch_sizes.items() if k <= b))
                                  for b in bounds] + [("+Inf", self.batches)],
                             sum_value=self.images)
            worker_errors = CounterMetricFamily(
                "vit_deploy_worker_errors", "Unexpected errors in the batch worker (each cost "
                "one batch a 500)", value=self.worker_errors)
        return [requests, latency, sizes, worker_errors,
                GaugeMetricFamily("vit_deploy_queue_depth", "Requests waiting for the batch "
                                  "worker", value=queue_depth),
                GaugeMetricFamily("vit_deploy_queue_capacity", "Requests that may wait; more "
                                  "are answered 503", value=max_queue),
                GaugeMetricFamily("vit_deploy_max_batch", "Images per session run at most",
                                  value=max_batch),
                GaugeMetricFamily("vit_deploy_worker_up", "1 while the batch worker runs",
                                  value=int(up))]


# -- the batching worker -------------------------------------------------------------------


@dataclass
class _Job:
    """One request: image bytes (/predict), or a (B, C, H, W) float32 array and the output
    names to return (v2 infer)."""

    data: Any
    future: asyncio.Future
    outputs: tuple[str, ...] | None = None  # None: a /predict job

    @property
    def tensor(self) -> bool:
        return self.outputs is not None

    @property
    def rows(self) -> int:
        return len(self.data) if self.tensor else 1


class Batcher:
    """Collects requests for up to `max_wait_ms` (or until they hold `max_batch` images)
    and runs them in a worker thread: /predict images and v2 tensors each grouped by size,
    one session call per group and per `max_batch` images (a v2 request's rows may span two
    calls; /predict and v2 never share one, as one is classified and the other is raw).

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
        return self._enqueue(_Job(image, asyncio.get_running_loop().create_future()))

    def submit_tensor(self, pixels: np.ndarray, outputs: tuple[str, ...]) -> asyncio.Future:
        """Queue a (B, C, H, W) batch of B <= max_batch images; its future gets {output
        name: (B, ...) array} for `outputs`, or a Failure. Failure(503) as for submit."""
        if not 1 <= len(pixels) <= self.max_batch:
            raise Failure(400, f"a request holds 1 to {self.max_batch} images (the max batch), "
                               f"got {len(pixels)}")
        return self._enqueue(_Job(pixels, asyncio.get_running_loop().create_future(),
                                  tuple(outputs)))

    def _enqueue(self, job: _Job) -> asyncio.Future:
        reason = self.stopped()
        if reason or self.queue is None:
            raise Failure(503, f"not serving: {reason}")
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            raise Failure(503, f"the server is busy: {self.max_queue} requests are already "
                               f"waiting (the limit); retry after {RETRY_AFTER_S} s",
                          {"Retry-After": str(RETRY_AFTER_S)}) from None
        return job.future

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
        rows = jobs[0].rows
        deadline = loop.time() + self.max_wait
        while rows < self.max_batch:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                jobs.append(await asyncio.wait_for(self.queue.get(), remaining))
            except asyncio.TimeoutError:
                break
            rows += jobs[-1].rows

    async def _answer(self, jobs: list[_Job]) -> None:
        live = [j for j in jobs if not j.future.done()]  # a client that went away: skipped
        if not live:
            return
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(None, self._predict, live)
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

    def _predict(self, jobs: list[_Job]) -> list[Any]:
        """One result per job: a dict, or a Failure for that job (or its group)."""
        rows: dict[bool, list[tuple[int, np.ndarray]]] = {False: [], True: []}  # by kind
        parts: list[list[Any]] = [[] for _ in jobs]  # each job's per-image results, in order
        for i, job in enumerate(jobs):
            if job.tensor:
                rows[True] += [(i, x) for x in job.data]
            else:
                x = self._prepare(job.data)
                if isinstance(x, Failure):
                    parts[i].append(x)
                else:
                    rows[False].append((i, x))
        for tensor, items in rows.items():
            run = self._infer if tensor else self._classify
            for indices, batch in group_by_shape(items):
                for start in range(0, len(indices), self.max_batch):
                    part = batch[start:start + self.max_batch]
                    self.metrics.batch(len(part))
                    for i, result in zip(indices[start:start + self.max_batch],
                                         run(part, len(part))):
                        parts[i].append(result)
        return [_job_result(job, got) for job, got in zip(jobs, parts)]

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

    def _infer(self, batch: np.ndarray, n: int) -> list[Any]:
        """n dicts {output name: that image's row}, or n times the same Failure(500)."""
        try:
            outputs = self._run_all(batch)
            short = {k: len(v) for k, v in outputs.items() if len(v) != n}
            if short:
                raise RuntimeError(f"session returned {short} rows for {n} images")
            return [{name: value[r] for name, value in outputs.items()} for r in range(n)]
        except Exception as e:  # as in _classify: only this group hears of it
            log.error("inference failed for a batch of %d: %s", n, _describe(e))
            return [Failure(500, f"inference failed: {_describe(e)}")] * n


    def _run_all(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """session.run_all; when it refuses the merged batch (its memory guard counts the
        whole batch, and each request passed it alone), one image at a time."""
        try:
            return self.session.run_all(batch)
        except InputError:
            if len(batch) == 1:
                raise
            parts = [self.session.run_all(batch[i:i + 1]) for i in range(len(batch))]
            return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def _job_result(job: _Job, parts: list[Any]) -> Any:
    """A job's result from its per-image results: a /predict job's one dict; a v2 job's
    {name: (B, ...) array} of the outputs it asked for; the first Failure among them."""
    missing = Failure(500, "internal error: the batch produced no result for this request")
    if len(parts) != job.rows:
        return missing
    failed = next((p for p in parts if isinstance(p, Failure)), None)
    if failed is not None:
        return failed
    if not job.tensor:
        return parts[0]
    try:
        return {name: np.stack([row[name] for row in parts]) for name in job.outputs or ()}
    except KeyError as e:
        return Failure(500, f"internal error: the model gave no output {e}")


def _settle(jobs: list[_Job], result: Any) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_result(result)


# -- requests ------------------------------------------------------------------------------


async def read_body(request: Request, limit: int, what: str = "image") -> bytes:
    """The body, counted chunk by chunk: Failure(413) as soon as it passes `limit` bytes,
    whatever content-length said (or did not say, for a chunked upload)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Failure(413, f"{what} is over the limit of {limit} bytes (got {size} bytes "
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


# -- the Open Inference Protocol: parsing a request, writing an answer ---------------------

_NUMPY = {datatype: np.dtype(name).newbyteorder("<") for name, datatype in V2_DATATYPES.items()}


@dataclass(frozen=True)
class InferRequest:
    """A parsed v2 infer request: input arrays by name, the outputs to return in order
    with whether each goes as binary data, and the request id to echo."""

    inputs: dict[str, np.ndarray]
    outputs: tuple[tuple[str, bool], ...]
    id: str | None = None


async def read_infer_body(request: Request, limit: int = MAX_INFER_BYTES) -> bytes:
    """A v2 infer body, counted as it arrives and inflated if gzip / deflate encoded (as
    tritonclient sends with request compression); Failure(4xx) if it is too large or
    cannot be read."""
    length = _declared_length(request)
    if length is not None and length > limit:
        raise Failure(413, f"inference request of {length} bytes is over the limit of {limit}")
    body = await read_body(request, limit, "inference request")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise Failure(415, f"content-encoding must be gzip, deflate or identity, got "
                           f"{encoding!r}")
    return await asyncio.to_thread(_inflate, body, encoding, limit)


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)  # deflate: zlib format
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as e:
        raise Failure(400, f"the body is not valid {encoding} data: {e}") from None
    if len(out) > limit:
        raise Failure(413, f"inference request inflates to over the limit of {limit} bytes")
    if not inflater.eof:
        raise Failure(400, f"the body is truncated {encoding} data")
    return out


def _bad(message: str) -> Failure:
    return Failure(400, message)


def _shape_text(shape: Any) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _json_tensor(name: str, data: Any, shape: list[int], dtype: np.dtype) -> np.ndarray:
    """An input's "data" (flat or nested, row-major) as an array of `shape`."""
    if not isinstance(data, list):
        raise _bad(f"input {name!r}: data must be a JSON array of numbers, got "
                   f"{type(data).__name__}")
    try:
        values = np.asarray(data)
    except (ValueError, TypeError):  # ragged nesting
        raise _bad(f"input {name!r}: data is not a regular array of numbers (ragged "
                   f"nesting)") from None
    if values.size and values.dtype.kind not in "iuf":
        raise _bad(f"input {name!r}: data must hold only numbers, got "
                   f"{'booleans' if values.dtype.kind == 'b' else 'other values'}")
    count = math.prod(shape)
    if values.size != count:
        raise _bad(f"input {name!r}: data holds {values.size} values, shape "
                   f"{_shape_text(shape)} needs {count}")
    return values.astype(dtype).reshape(shape)


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _list_of_objects(value: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _bad(f"{what} must be a JSON array of objects")
    return value


def parse_infer_request(body: bytes, header_length: str | None, model: V2Model, *,
                        max_batch: int) -> InferRequest:
    """A v2 infer body -> InferRequest, or Failure(400) saying what is wrong: malformed
    JSON, an unknown input or output, a datatype or shape the model does not take, data
    that does not fill the shape, binary data that does not add up."""
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        text = header_length.strip()
        if not text.isdigit():
            raise _bad(f"Inference-Header-Content-Length must be a number of bytes, got "
                       f"{header_length[:40]!r}")
        if int(text) > len(body):
            raise _bad(f"Inference-Header-Content-Length says the JSON header is {int(text)} "
                       f"bytes, but the body has only {len(body)}")
        header, binary = body[:int(text)], memoryview(body)[int(text):]
    try:
        request = json.loads(header)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError
        raise _bad(f"the request is not valid JSON: {_describe(e)}") from None
    if not isinstance(request, dict):
        raise _bad(f"the request must be a JSON object, got {type(request).__name__}")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _bad(f"id must be a string, got {type(request_id).__name__}")
    parameters = _object(request.get("parameters"), "parameters")
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise _bad("parameters.binary_data_output must be true or false")

    specs = {t.name: t for t in model.inputs}
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for item in _list_of_objects(request.get("inputs"), "inputs"):
        name = item.get("name")
        if name not in specs:
            raise _bad(f"unknown input {name!r}: model {model.name!r} takes {list(specs)}")
        if name in inputs:
            raise _bad(f"input {name!r} is given twice")
        spec = specs[name]
        if item.get("datatype") != spec.datatype:
            raise _bad(f"input {name!r} has datatype {item.get('datatype')!r}; the model "
                       f"takes {spec.datatype}")
        shape = item.get("shape")
        if not (isinstance(shape, list) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                and len(shape) == len(spec.shape)
                and all(w in (-1, d) for w, d in zip(spec.shape, shape))):
            raise _bad(f"input {name!r} has shape {shape!r}; the model takes "
                       f"{_shape_text(spec.shape)} (-1: any size)")
        if not 1 <= shape[0] <= max_batch:
            raise _bad(f"input {name!r} holds a batch of {shape[0]}; this server takes 1 to "
                       f"{max_batch} (its max batch)")
        dtype = _NUMPY[spec.datatype]
        iparams = _object(item.get("parameters"), f"input {name!r}: parameters")
        if "shared_memory_region" in iparams:
            raise _bad("the shared memory extension is not supported: send the data")
        size = iparams.get("binary_data_size")
        if size is not None:
            need = math.prod(shape) * dtype.itemsize
            if not isinstance(size, int) or isinstance(size, bool) or size != need:
                raise _bad(f"input {name!r}: binary_data_size is {size!r}, shape "
                           f"{_shape_text(shape)} of {spec.datatype} needs {need} bytes")
            if offset + size > len(binary):
                raise _bad(f"input {name!r}: its binary data would end at byte {offset + size} "
                           f"after the JSON header, but only {len(binary)} bytes follow it")
            inputs[name] = np.frombuffer(binary[offset:offset + size], dtype).reshape(shape)
            offset += size
        elif "data" in item:
            inputs[name] = _json_tensor(name, item["data"], shape, dtype)
        else:
            raise _bad(f"input {name!r} has neither data nor a binary_data_size parameter")
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise _bad(f"missing input(s) {missing}: model {model.name!r} takes {list(specs)}")
    if offset != len(binary):
        raise _bad(f"{len(binary) - offset} bytes after the JSON header belong to no input "
                   f"(the inputs' binary_data_size add up to {offset})")

    outputs: list[tuple[str, bool]] = []
    for item in _list_of_objects(request.get("outputs", []), "outputs"):
        name = item.get("name")
        if model.output(name) is None:
            raise _bad(f"unknown output {name!r}: model {model.name!r} gives "
                       f"{[t.name for t in model.outputs]}")
        if name in (n for n, _ in outputs):
            raise _bad(f"output {name!r} is asked for twice")
        oparams = _object(item.get("parameters"), f"output {name!r}: parameters")
        for unsupported, what in (("classification", "the classification extension"),
                                  ("shared_memory_region", "the shared memory extension")):
            if unsupported in oparams:
                raise _bad(f"output {name!r}: {what} is not supported (ask for the raw output; "
                           f"POST /predict classifies)")
        binary = oparams.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise _bad(f"output {name!r}: binary_data must be true or false")
        outputs.append((name, binary))
    if not outputs:  # none named: all of them
        outputs = [(t.name, binary_default) for t in model.outputs]
    return InferRequest(inputs=inputs, outputs=tuple(outputs), id=request_id)


def encode_infer_response(model: V2Model, request: InferRequest,
                          results: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of a v2 infer answer: JSON, followed by the binary outputs' bytes
    (little-endian, row-major) when any output asked for binary data."""
    outputs, blobs = [], []
    for name, binary in request.outputs:
        datatype = model.output(name).datatype  # type: ignore[union-attr]  # parsed: it exists
        value = np.ascontiguousarray(results[name], dtype=_NUMPY[datatype])
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(value.shape)}
        if binary:
            blobs.append(value.tobytes())
            entry["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            entry["data"] = value.ravel().tolist()
        outputs.append(entry)
    answer: dict[str, Any] = {"model_name": model.name, "model_version": MODEL_VERSION}
    if request.id is not None:
        answer["id"] = request.id
    header = json.dumps(answer | {"outputs": outputs}, separators=(",", ":")).encode()
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {"content-type": "application/octet-stream",
                                      HEADER_LENGTH: str(len(header))}


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


def _version() -> str:
    try:
        return _metadata.version("vit-deploy")
    except _metadata.PackageNotFoundError:
        return "unknown"


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


def make_app(session: Any, *, max_batch: int = 8, max_wait_ms: float = 5.0, top_k: int = 5,
             max_queue: int | None = None, model_name: str | None = None,
             max_infer_bytes: int = MAX_INFER_BYTES) -> FastAPI:
    """A FastAPI app: POST /predict, GET /health, /metadata, /stats, /metrics (Prometheus
    text), and the v2 endpoints for the session's model (named `model_name`, default the
    bundle directory's name).

    At most `max_queue` requests wait (default 64 batches' worth); more get 503."""
    model = serving_model(session, model_name)
    batcher = Batcher(session, max_batch=max_batch, max_wait_ms=max_wait_ms, top_k=top_k,
                      max_queue=max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.task = batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="vit-deploy", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.state.batcher = batcher
    app.state.model = model

    def error(failure: Failure, endpoint: str | None = None) -> JSONResponse:
        if endpoint is not None:
            batcher.metrics.answered(endpoint, failure.status)
        return JSONResponse({"error": failure.message}, status_code=failure.status,
                            headers=failure.headers)

    def client_gone(endpoint: str) -> Response:
        batcher.metrics.answered(endpoint, CLIENT_GONE)
        log.debug("client disconnected before its answer")
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        """Unknown paths and methods: the same {"error": ...} body as every other error."""
        return JSONResponse({"error": f"{e.detail}: {request.method} {request.url.path}"},
                            status_code=e.status_code, headers=e.headers)

    async def answer(request: Request, endpoint: str, submit: Callable[[], Awaitable[Any]],
                     respond: Callable[[Any], Awaitable[Response]]) -> Response:
        """Submit (reading the request), wait for the batch worker, respond; every failure
        answered to this request and counted under `endpoint`."""
        t0 = time.perf_counter()
        try:
            future = await submit()
        except Failure as f:
            return error(f, endpoint)
        except ClientDisconnect:
            return client_gone(endpoint)
        try:
            result = await wait_for_result(request, future)
            if result is None:
                return client_gone(endpoint)
            if isinstance(result, Failure):
                return error(result, endpoint)
            response = await respond(result)
        except asyncio.CancelledError:  # uvicorn cancels handlers only when shutting down
            _absorb_cancellation()  # answered instead: a 503, not a traceback
            return error(Failure(503, "the server is shutting down"), endpoint)
        batcher.metrics.answered(endpoint, 200, (time.perf_counter() - t0) * 1000)
        return response

    @app.post("/predict")
    async def predict(request: Request):
        async def submit() -> asyncio.Future:
            return batcher.submit(await read_image(request))

        async def respond(result: dict[str, Any]) -> Response:
            return JSONResponse(result)

        return await answer(request, "predict", submit, respond)

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

    @app.get("/stats")
    async def stats():
        return batcher.metrics.snapshot() | {
            "max_batch": max_batch, "max_wait_ms": max_wait_ms,
            "queue_depth": batcher.queue.qsize() if batcher.queue else 0,
            "max_queue": batcher.max_queue}

    registry = CollectorRegistry(auto_describe=False)

    class Exposition:  # prometheus_client asks collect() on every scrape
        def collect(self) -> Iterator[Any]:
            yield from batcher.metrics.families(
                max_batch=max_batch, queue_depth=batcher.queue.qsize() if batcher.queue else 0,
                max_queue=batcher.max_queue, up=batcher.stopped() is None)

    registry.register(Exposition())

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # -- the Open Inference Protocol (KServe v2 REST) --

    def find_model(name: str, version: str | None) -> None:
        if name != model.name:
            raise Failure(404, f"unknown model {name!r}: this server serves {model.name!r}")
        if version is not None and version != MODEL_VERSION:
            raise Failure(404, f"model {name!r} has no version {version!r}: it has "
                               f"{list(model.versions)}")

    @app.get("/v2")
    async def v2_server():
        return {"name": "vit-deploy", "version": _version(), "extensions": ["binary_tensor_data"]}

    @app.get("/v2/health/live")
    async def v2_live():
        reason = batcher.stopped()  # a dead worker is worth a restart: not live
        return JSONResponse({"live": reason is None} | ({"reason": reason} if reason else {}),
                            status_code=503 if reason else 200)

    def readiness(**fields: Any) -> JSONResponse:
        """200 {"ready": true}, or 503 with the reason the batch worker stopped."""
        reason = batcher.stopped()
        return JSONResponse(fields | {"ready": reason is None}
                            | ({"reason": reason} if reason else {}),
                            status_code=503 if reason else 200)

    @app.get("/v2/health/ready")
    async def v2_ready():
        return readiness()

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def v2_model(name: str, version: str | None = None):
        try:
            find_model(name, version)
        except Failure as f:
            return error(f)
        return model.to_dict()

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def v2_model_ready(name: str, version: str | None = None):
        try:
            find_model(name, version)
        except Failure as f:
            return error(f)
        return readiness(name=model.name)

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def v2_infer(name: str, request: Request, version: str | None = None):
        parsed: list[InferRequest] = []

        async def submit() -> asyncio.Future:
            find_model(name, version)
            body = await read_infer_body(request, max_infer_bytes)
            got = await asyncio.to_thread(parse_infer_request, body,
                                          request.headers.get(HEADER_LENGTH), model,
                                          max_batch=max_batch)
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

        return await answer(request, "v2", submit, respond)

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
