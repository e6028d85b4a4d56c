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

Hostile clients meet `Limits` (one frozen dataclass, carried by the app to `serve`):
- connections: the request line and headers must arrive within `header_timeout_s` (from
  the connection, or from the previous answer on a kept-alive one), a body within
  `body_timeout_s` of its headers, else 408 and the connection closes; at most
  `max_connections` are open (default: under the process's descriptor limit, with
  room for what asyncio accepts at once), and a new
  one past that closes the oldest one that is not being answered (idle, or half-open);
- memory: sizes are checked from what is declared before anything is read or decoded
  (Content-Length, image dimensions from the image header, tensor shapes x datatype
  before their data is parsed); tensor data in JSON is parsed straight into arrays (no
  Python float per value); at most `max_bodies` bodies are read and parsed at once and
  `max_body_bytes` of them are held until answered, else 503 with Retry-After;
- answers: non-finite numbers are refused in inputs (400) and never sent as JSON;
- logs: a message repeated by a flood (accept errors, invalid requests) is logged once,
  then at most once per `LOG_REPEAT_S` with a count of what was left out.
"""

import asyncio
import bisect
import collections
import contextlib
import errno
import io
import json
import logging
import math
import os
import re
import resource
import socket
import threading
import time
import warnings
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, replace
from importlib import metadata as _metadata
from typing import Any

import h11
import numpy as np
import uvicorn
from PIL import Image
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from uvicorn.protocols.http.h11_impl import H11Protocol

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
LOG_REPEAT_S = 10.0  # a repeated log message: once, then at most once per this many seconds
TIMED_OUT = "vit_deploy.timed_out"  # set in the ASGI scope when the server closed a slow request


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one client may cost the server. Timeouts in seconds; `max_connections` None:
    from the descriptor limit (`connection_plan()`)."""

    header_timeout_s: float = 10.0  # request line + headers, from connect or the last answer
    body_timeout_s: float = 60.0  # the whole body, from its headers (64 MB at ~1 MB/s)
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    max_connections: int | None = None
    max_bodies: int = 32  # request bodies being read and parsed at once
    max_body_bytes: int = 256 * 1024 * 1024  # of bodies held, from reading to the answer
    max_image_bytes: int = MAX_IMAGE_BYTES
    max_image_pixels: int = 24_000_000  # width x height from the header (6000 x 4000)
    max_infer_bytes: int = MAX_INFER_BYTES
    max_json_bytes: int = 8 * 1024 * 1024  # of a v2 JSON header outside its number arrays

    def __post_init__(self) -> None:
        bad = [f"{k}={v!r}" for k, v in vars(self).items()
               if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                     or v <= 0)]
        if bad:
            raise ValueError(f"limits must be positive numbers, got {', '.join(bad)}")
        if self.max_body_bytes < max(self.max_infer_bytes, self.max_image_bytes):
            raise ValueError(f"max_body_bytes ({self.max_body_bytes}) must hold at least one "
                             f"largest request (max_infer_bytes {self.max_infer_bytes}, "
                             f"max_image_bytes {self.max_image_bytes})")


def connection_plan(limits: Limits) -> tuple[int, int]:
    """(connections, accept backlog) that fit the process's descriptor limit (soft
    RLIMIT_NOFILE). asyncio accepts up to `backlog` connections per loop pass, and a new
    connection reaches the limit (connection_made) two or three passes later, so three
    backlogs must fit beside the connections: backlog an eighth of the descriptors (16 to
    2048), connections what is left less 32 for the model, logs, pipes and the event loop
    (at most 4096), or `limits.max_connections` if given."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    backlog = max(16, min(2048, soft // 8))
    if limits.max_connections is not None:
        return limits.max_connections, backlog
    return max(8, min(4096, soft - 3 * backlog - 32)), backlog


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
            if not all(math.isfinite(c.probability) for top in rows for c in top):
                return [Failure(500, "the model gave non-finite scores (NaN or Infinity) for "
                                     "this batch: not sent as data")] * n
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


class BodyBudget:
    """How many request bodies are being read and parsed at once (`max_bodies`), and how
    many bytes of bodies are held from their first byte until their request is answered
    (`max_body_bytes`): past either, Failure(503) with Retry-After, before reading more.
    Used from the event loop only."""

    def __init__(self, max_bodies: int, max_bytes: int):
        self.max_bodies, self.max_bytes = max_bodies, max_bytes
        self.bodies = self.bytes = 0

    def _busy(self, what: str) -> Failure:
        return Failure(503, f"the server is busy: {what}; retry after {RETRY_AFTER_S} s",
                       {"Retry-After": str(RETRY_AFTER_S)})

    def claim(self) -> "BodyClaim":
        if self.bodies >= self.max_bodies:
            raise self._busy(f"{self.max_bodies} request bodies are being read (the limit)")
        self.bodies += 1
        return BodyClaim(self)


class BodyClaim:
    """One request's share of a BodyBudget: a body slot until `parsed()`, bytes until
    `release()`."""

    def __init__(self, budget: BodyBudget):
        self.budget, self.bytes, self.reading = budget, 0, True

    def need(self, total: int) -> None:
        """This request holds `total` bytes now (it only grows); Failure(503) if the
        budget cannot take them."""
        extra = total - self.bytes
        if extra <= 0:
            return
        if self.budget.bytes + extra > self.budget.max_bytes:
            raise self.budget._busy(f"{self.budget.bytes} bytes of requests are held and this "
                                    f"one needs {total} (the limit is {self.budget.max_bytes})")
        self.budget.bytes += extra
        self.bytes = total

    def parsed(self) -> None:
        if self.reading:
            self.reading = False
            self.budget.bodies -= 1

    def release(self) -> None:
        self.parsed()
        self.budget.bytes -= self.bytes
        self.bytes = 0


async def read_body(request: Request, limit: int, what: str = "image",
                    claim: BodyClaim | None = None) -> bytes:
    """The body, counted chunk by chunk: Failure(413) as soon as it passes `limit` bytes,
    whatever content-length said (or did not say, for a chunked upload). With a claim,
    the declared length is claimed before the first byte is read, and what arrives past it
    as it arrives."""
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise Failure(413, f"{what} of {declared} bytes is over the limit of {limit} bytes")
    if claim is not None and declared:
        claim.need(declared)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Failure(413, f"{what} is over the limit of {limit} bytes (got {size} bytes "
                               f"so far)")
        if claim is not None:
            claim.need(size)
        chunks.append(chunk)
    return b"".join(chunks)


async def _replay(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _multipart_image(request: Request, limit: int, claim: BodyClaim | None) -> bytes:
    body = await read_body(request, limit + MULTIPART_OVERHEAD, claim=claim)
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


async def read_image(request: Request, limits: Limits | None = None,
                     claim: BodyClaim | None = None) -> bytes:
    """The image bytes of a /predict request, or Failure(4xx) saying what was wrong. Its
    dimensions are read from the image header (nothing decoded): over
    `limits.max_image_pixels`, Failure(413)."""
    limits = limits or Limits()
    limit = limits.max_image_bytes
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        data = await _multipart_image(request, limit, claim)
    elif ctype.startswith(("image/", "application/octet-stream")):
        data = await read_body(request, limit, claim=claim)
    else:
        raise Failure(415, f"content type must be an image/*, application/octet-stream or "
                           f"multipart/form-data, got {ctype or 'none'!r}")
    if len(data) > limit:
        raise Failure(413, f"image of {len(data)} bytes is over the limit of {limit}")
    if not data:
        raise Failure(400, "empty request body: send an image")
    check_image_header(data, limits.max_image_pixels)
    return data


def check_image_header(data: bytes, max_pixels: int) -> None:
    """Failure(413) if the image header declares more than `max_pixels` pixels; reads the
    header only (what Pillow's open reads), decodes nothing. Bytes Pillow cannot open pass:
    the decoder answers them 400 with its own reason."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError as e:  # Pillow's own bound, past ours anyway
        raise Failure(413, f"image is over Pillow's decompression-bomb limit ({e})") from None
    except Exception:  # not an image Pillow knows (or a hostile header): the decoder says why
        return
    if width * height > max_pixels:
        raise Failure(413, f"image is {width}x{height} = {width * height} pixels, over this "
                           f"server's limit of {max_pixels} pixels (resize it first)")


# -- the Open Inference Protocol: parsing a request, writing an answer ---------------------

_NUMPY = {datatype: np.dtype(name).newbyteorder("<") for name, datatype in V2_DATATYPES.items()}


@dataclass(frozen=True)
class InferRequest:
    """A parsed v2 infer request: input arrays by name, the outputs to return in order
    with whether each goes as binary data, and the request id to echo."""

    inputs: dict[str, np.ndarray]
    outputs: tuple[tuple[str, bool], ...]
    id: str | None = None


async def read_infer_body(request: Request, limit: int = MAX_INFER_BYTES,
                          claim: BodyClaim | None = None) -> bytes:
    """A v2 infer body, counted as it arrives and inflated if gzip / deflate encoded (as
    tritonclient sends with request compression); Failure(4xx) if it is too large or
    cannot be read. With a claim, the inflated bytes are claimed too."""
    body = await read_body(request, limit, "inference request", claim)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise Failure(415, f"content-encoding must be gzip, deflate or identity, got "
                           f"{encoding!r}")
    if claim is not None:
        claim.need(len(body) + limit)  # the inflated body may reach the limit
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


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (what a client sent)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    return "an array" if isinstance(value, list) else "an object"


# In a v2 JSON header, tensor data is the bulk: long arrays of plain numbers. They are cut
# out before json.loads (which would make a Python float of each value, ~16x the text) and
# parsed by numpy straight into the tensor, once the declared shape says how many values
# to expect. Strings are matched first, so brackets inside a string are never taken for
# an array.
_STRING_OR_NUMBERS = re.compile(rb'"(?:[^"\\]|\\.)*"|\[[-+0-9.eE,\s]*\]')
_SPAN_MIN = 256  # shorter arrays (shapes, small data) stay in the JSON


@dataclass
class _Spans:
    """The number arrays cut out of a JSON header: (start, end) of each one's text between
    its brackets, and the marker key that stands for them in the rest (unguessable, so a
    client cannot forge a reference)."""

    text: bytes
    places: list[tuple[int, int]]
    key: str
    used: set[int]

    def ref(self, node: Any) -> int | None:
        """The index of the span a parsed node stands for, or None."""
        if isinstance(node, dict) and len(node) == 1 and self.key in node:
            return node[self.key]
        return None

    def count(self, i: int) -> int:
        start, end = self.places[i]
        return self.text.count(b",", start, end) + 1

    def parse(self, i: int, dtype: np.dtype) -> np.ndarray | None:
        """The span's numbers as a 1-D array, or None if it is not a list of numbers."""
        start, end = self.places[i]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns (and stops) on text it cannot read
            try:
                return np.fromstring(self.text[start:end], dtype=dtype, sep=",")
            except (ValueError, DeprecationWarning, RuntimeWarning):
                return None


def _load_header(header: bytes, max_json_bytes: int) -> tuple[Any, _Spans]:
    """json.loads of a v2 JSON header with its long number arrays cut out (see above);
    Failure(413) if what remains is over `max_json_bytes`, Failure(400) if not JSON."""
    spans = _Spans(header, [], "\0" + os.urandom(8).hex(), set())
    pieces: list[tuple[int, int] | bytes] = []
    at = kept = 0
    for m in _STRING_OR_NUMBERS.finditer(header):
        if header[m.start()] != ord("[") or m.end() - m.start() < _SPAN_MIN:
            continue
        marker = json.dumps({spans.key: len(spans.places)}).encode()
        pieces += [(at, m.start()), marker]
        kept += m.start() - at + len(marker)
        spans.places.append((m.start() + 1, m.end() - 1))
        at = m.end()
    pieces.append((at, len(header)))
    kept += len(header) - at
    if kept > max_json_bytes:
        raise Failure(413, f"the request's JSON is {kept} bytes besides its arrays of plain "
                           f"numbers, over the limit of {max_json_bytes} (send tensor data as "
                           f"arrays of numbers, or as binary data)")
    text = b"".join(header[p[0]:p[1]] if isinstance(p, tuple) else p for p in pieces)
    try:
        return json.loads(text), spans
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError
        raise _bad(f"the request is not valid JSON: {_describe(e)}") from None


def _data_shape(name: str, node: Any, spans: _Spans) -> tuple[int, ...]:
    """The shape of an input's (maybe nested) data, spans counted by their commas; 400 if
    it holds anything but numbers or is ragged."""
    i = spans.ref(node)
    if i is not None:
        if not isinstance(i, int) or not 0 <= i < len(spans.places) or i in spans.used:
            raise _bad(f"input {name!r}: data is malformed")
        spans.used.add(i)
        return (spans.count(i),)
    if isinstance(node, bool) or not isinstance(node, (int, float, list)):
        raise _bad(f"input {name!r}: data must hold only numbers, got {_json_type(node)}")
    if not isinstance(node, list):
        return ()
    if all(type(v) in (int, float) for v in node):
        return (len(node),)
    shapes = {_data_shape(name, v, spans) for v in node}
    if len(shapes) > 1:
        raise _bad(f"input {name!r}: data is not a regular array of numbers (ragged "
                   f"nesting)")
    return (len(node), *(shapes.pop() if shapes else ()))


def _fill(name: str, node: Any, spans: _Spans, out: np.ndarray, at: int) -> int:
    """Write a node's numbers into the flat `out` from `at`; returns where it ended."""
    i = spans.ref(node)
    if i is not None:
        values = spans.parse(i, out.dtype)
        if values is None or len(values) != spans.count(i):
            raise _bad(f"input {name!r}: data is not a JSON array of numbers (an array of "
                       f"{spans.count(i)} items could not be read as numbers)")
    elif isinstance(node, list) and all(type(v) in (int, float) for v in node):
        with np.errstate(over="ignore", invalid="ignore"):  # out of range: inf, refused later
            values = np.asarray(node, dtype=np.float64).astype(out.dtype)
    elif isinstance(node, list):
        for v in node:
            at = _fill(name, v, spans, out, at)
        return at
    else:
        values = np.asarray([node], dtype=np.float64).astype(out.dtype)
    out[at:at + len(values)] = values
    return at + len(values)


def _json_tensor(name: str, data: Any, shape: list[int], dtype: np.dtype,
                 spans: _Spans) -> np.ndarray:
    """An input's "data" (flat or nested, row-major) as an array of `shape`: the values are
    counted before any of them is parsed."""
    if not isinstance(data, list) and spans.ref(data) is None:
        raise _bad(f"input {name!r}: data must be a JSON array of numbers, got "
                   f"{_json_type(data)}")
    count = math.prod(_data_shape(name, data, spans))
    need = math.prod(shape)
    if count != need:
        raise _bad(f"input {name!r}: data holds {count} values, shape {_shape_text(shape)} "
                   f"needs {need}")
    i = spans.ref(data)
    if i is not None:  # one flat array of numbers (what tritonclient sends): no copy
        values = spans.parse(i, dtype)
        if values is not None and len(values) == need:
            return values.reshape(shape)
    out = np.empty(need, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        _fill(name, data, spans, out, 0)
    return out.reshape(shape)


def require_finite(what: str, x: np.ndarray, datatype: str) -> None:
    """Failure(400) naming how many values of a float tensor are NaN / +-Infinity (or were
    out of the datatype's range, e.g. 1e39 for FP32) and where the first one is."""
    if x.dtype.kind != "f":
        return
    bad = ~np.isfinite(x)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), x.shape)
        raise _bad(f"{what} holds {int(bad.sum())} value(s) that are not finite {datatype} "
                   f"numbers (NaN, Infinity, or beyond {datatype}'s range of "
                   f"+-{float(np.finfo(x.dtype).max):.4g}), the first at index "
                   f"{list(map(int, first))}: expected finite numbers")


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _list_of_objects(value: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _bad(f"{what} must be a JSON array of objects, got {_json_type(value)}")
    odd = next((v for v in value if not isinstance(v, dict)), None)
    if odd is not None or None in value:
        raise _bad(f"{what} must be a JSON array of objects, got an array holding "
                   f"{_json_type(odd)}")
    return value


def parse_infer_request(body: bytes, header_length: str | None, model: V2Model, *,
                        max_batch: int, limits: Limits | None = None) -> InferRequest:
    """A v2 infer body -> InferRequest, or Failure(400) saying what is wrong: malformed
    JSON, a field of the wrong JSON type, an unknown input or output, a datatype or shape
    the model does not take, data that does not fill the shape, binary data that does not
    add up, non-finite numbers. Failure(413) when a declared shape is over the limit (said
    before its data is read)."""
    limits = limits or Limits()
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
    request, spans = _load_header(header, limits.max_json_bytes)
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
    for index, item in enumerate(_list_of_objects(request.get("inputs"), "inputs")):
        name = item.get("name")
        if not isinstance(name, str):
            raise _bad(f"inputs[{index}].name must be a string (one of {list(specs)}), got "
                       f"{_json_type(name)}")
        if name not in specs:
            raise _bad(f"unknown input {name!r}: model {model.name!r} takes {list(specs)}")
        if name in inputs:
            raise _bad(f"input {name!r} is given twice")
        spec = specs[name]
        if item.get("datatype") != spec.datatype:
            given = item.get("datatype")
            given = repr(given) if isinstance(given, str) else _json_type(given)
            raise _bad(f"input {name!r} has datatype {given}; the model takes "
                       f"{spec.datatype}")
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
        declared = math.prod(shape) * dtype.itemsize
        if declared > limits.max_infer_bytes:
            raise Failure(413, f"input {name!r} has shape {_shape_text(shape)} of "
                               f"{spec.datatype}: {declared} bytes, over the limit of "
                               f"{limits.max_infer_bytes}")
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
            inputs[name] = _json_tensor(name, item["data"], shape, dtype, spans)
        else:
            raise _bad(f"input {name!r} has neither data nor a binary_data_size parameter")
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise _bad(f"missing input(s) {missing}: model {model.name!r} takes {list(specs)}")
    if offset != len(binary):
        raise _bad(f"{len(binary) - offset} bytes after the JSON header belong to no input "
                   f"(the inputs' binary_data_size add up to {offset})")
    for name, x in inputs.items():
        require_finite(f"input {name!r}", x, specs[name].datatype)

    outputs: list[tuple[str, bool]] = []
    for index, item in enumerate(_list_of_objects(request.get("outputs", []), "outputs")):
        name = item.get("name")
        if not isinstance(name, str):
            raise _bad(f"outputs[{index}].name must be a string (one of "
                       f"{[t.name for t in model.outputs]}), got {_json_type(name)}")
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
    (little-endian, row-major) when any output asked for binary data. Failure(500) if an
    output holds NaN / Infinity: that is a broken model, not data (and not JSON)."""
    outputs, blobs = [], []
    for name, binary in request.outputs:
        datatype = model.output(name).datatype  # type: ignore[union-attr]  # parsed: it exists
        value = np.ascontiguousarray(results[name], dtype=_NUMPY[datatype])
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise Failure(500, f"the model's output {name!r} holds "
                               f"{int((~np.isfinite(value)).sum())} non-finite value(s) (NaN or "
                               f"Infinity) for finite inputs: not sent as data")
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
    header = json.dumps(answer | {"outputs": outputs}, separators=(",", ":"),
                        allow_nan=False).encode()
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
    model = serving_model(session, model_name)
    budget = BodyBudget(limits.max_bodies, limits.max_body_bytes)
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
    app.state.limits = limits
    app.state.budget = budget

    def error(failure: Failure, endpoint: str | None = None) -> JSONResponse:
        if endpoint is not None:
            batcher.metrics.answered(endpoint, failure.status)
        return JSONResponse({"error": failure.message}, status_code=failure.status,
                            headers=failure.headers)

    def client_gone(request: Request, endpoint: str) -> Response:
        """The connection is gone: the client left, or the server closed it (a timeout,
        already answered 408 by the connection itself)."""
        status = 408 if request.scope.get(TIMED_OUT) else CLIENT_GONE
        batcher.metrics.answered(endpoint, status)
        log.debug("connection gone before its answer (%d)", status)
        return Response(status_code=status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        """Unknown paths and methods: the same {"error": ...} body as every other error."""
        return JSONResponse({"error": f"{e.detail}: {request.method} {request.url.path}"},
                            status_code=e.status_code, headers=e.headers)

    async def answer(request: Request, endpoint: str,
                     submit: Callable[[BodyClaim], Awaitable[Any]],
                     respond: Callable[[Any], Awaitable[Response]]) -> Response:
        """Submit (reading the request under a claim on the body budget), wait for the
        batch worker, respond; every failure answered to this request and counted under
        `endpoint`. The claim's bytes are held until the answer."""
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
                return client_gone(request, endpoint)
            if isinstance(result, Failure):
                return error(result, endpoint)
            response = await respond(result)
        except Failure as f:
            return error(f, endpoint)
        except ClientDisconnect:
            return client_gone(request, endpoint)
        except asyncio.CancelledError:  # uvicorn cancels handlers only when shutting down
            _absorb_cancellation()  # answered instead (a 503), not a traceback: a cancelled
            return error(Failure(503, "the server is shutting down"), endpoint)  # read too
        finally:
            if claim is not None:
                claim.release()
        batcher.metrics.answered(endpoint, 200, (time.perf_counter() - t0) * 1000)
        return response

    @app.post("/predict")
    async def predict(request: Request):
        async def submit(claim: BodyClaim) -> asyncio.Future:
            return batcher.submit(await read_image(request, limits, claim))

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

        async def submit(claim: BodyClaim) -> asyncio.Future:
            find_model(name, version)
            body = await read_infer_body(request, limits.max_infer_bytes, claim)
            got = await asyncio.to_thread(parse_infer_request, body,
                                          request.headers.get(HEADER_LENGTH), model,
                                          max_batch=max_batch, limits=limits)
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


class RepeatFilter(logging.Filter):
    """Lets a message through the first time, then at most once per `every` seconds per
    (logger, level, message template), with how many were left out in between and
    without their tracebacks: a flood of accept errors or invalid requests costs a few
    lines, not gigabytes."""

    def __init__(self, every: float = LOG_REPEAT_S, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every, self.clock = every, clock
        self.seen: dict[tuple[str, int, str], list[float]] = {}  # key -> [last shown, skipped]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = self.clock()
        with self._lock:
            seen = self.seen.get(key)
            if seen is None:
                if len(self.seen) >= 1000:  # fixed memory, whatever the messages
                    self.seen.clear()
                self.seen[key] = [now, 0]
                return True
            if now - seen[0] < self.every:
                seen[1] += 1
                return False
            skipped, seen[:] = int(seen[1]), [now, 0]
        if skipped:
            record.msg = f"{record.msg} [repeated: {skipped} more like this in the last " \
                         f"{self.every:g} s were not logged]"
            record.exc_info, record.exc_text = None, None
        return True


@contextlib.contextmanager
def _quiet_floods(every: float = LOG_REPEAT_S) -> Iterator[RepeatFilter]:
    """A RepeatFilter on the loggers a flood of bad connections writes to, while serving."""
    flt = RepeatFilter(every)
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "asyncio", __name__)]
    for logger in loggers:
        logger.addFilter(flt)
    try:
        yield flt
    finally:
        for logger in loggers:
            logger.removeFilter(flt)


class _Connections:
    """The open connections of one server, oldest first, and their limit. Past the limit
    a new connection closes the oldest one that is not being answered (half-open, idle
    between requests, or draining a body already answered); if every one is being
    answered, the new one is closed."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open: dict["GuardedH11Protocol", None] = {}  # insertion order: oldest first
        self.closed = 0  # by the limit

    def admit(self, conn: "GuardedH11Protocol") -> None:
        self.open[conn] = None
        if len(self.open) <= self.limit:
            return
        victim = next((c for c in self.open if c is not conn and c.idle()), conn)
        self.open.pop(victim, None)
        self.closed += 1
        log.warning("%d connections are open (the limit): closed the oldest one not being "
                    "answered (%d so far)", self.limit, self.closed)
        victim.transport.close()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines and a bound on connections (`serve` makes a
    subclass per server with `limits` and `registry` set):
    - waiting for a request (connect, or the previous answer): the request line and headers
      within `header_timeout_s`, else 408 (if some of them came) and close;
    - reading a body: all of it within `body_timeout_s` of the headers, else 408 (if the
      app has not answered yet) and close; the app reads a disconnect and stops;
    - the app working on a request: no deadline here (the batcher's queue is bounded)."""

    limits: Limits
    registry: _Connections

    _timer: asyncio.TimerHandle | None = None
    _phase: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.registry.admit(self)
        self._update()

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.open.pop(self, None)
        self._set_timer(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._update()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update()

    def idle(self) -> bool:
        """Not being answered: no request, or its answer is complete."""
        return self.cycle is None or self.cycle.response_complete

    def _current_phase(self) -> str | None:
        if self.transport.is_closing():
            return None
        their = self.conn.their_state
        if their is h11.IDLE:
            return "headers"
        if their is h11.SEND_BODY:
            return "body"
        return None

    def _update(self) -> None:
        phase = self._current_phase()
        if phase != self._phase:
            self._phase = phase
            self._set_timer(phase)

    def _set_timer(self, phase: str | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if phase is not None:
            delay = (self.limits.header_timeout_s if phase == "headers"
                     else self.limits.body_timeout_s)
            self._timer = self.loop.call_later(delay, self._expired, phase)

    def _expired(self, phase: str) -> None:
        self._timer = None
        if self.transport.is_closing() or self._current_phase() != phase:
            return
        if phase == "headers":
            if self.conn.trailing_data[0]:  # part of a request came, not all of it
                self._write_408(f"the request line and headers did not arrive within "
                                f"{self.limits.header_timeout_s:g} s (the header timeout)")
        elif self.cycle is not None and not self.cycle.response_started:
            self.cycle.scope[TIMED_OUT] = "body"  # type: ignore[literal-required]
            self.cycle.disconnected = True  # the app's next receive is a disconnect
            self.cycle.message_event.set()
            self._write_408(f"the request body did not arrive within "
                            f"{self.limits.body_timeout_s:g} s of its headers (the body "
                            f"timeout)")
        log.info("closed a connection: its %s did not arrive in time", phase)
        self.transport.close()

    def _write_408(self, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json"
                             b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))


def serve(app: Any, host: str, port: int, *, on_ready: Callable[[str], None],
          log_level: str = "warning", limits: Limits | None = None) -> None:
    """Bind host:port first (BindError, an OSError, before anything else happens), then
    call `on_ready(url)` (the real port when `port` is 0), then run uvicorn on that socket
    until it is stopped (Ctrl-C / SIGTERM in the main thread). The connection limits are
    `limits`, else the app's (`app.state.limits`, as make_app sets), else `Limits()`."""
    sock = bind(host, port)
    try:
        limits = limits or getattr(getattr(app, "state", None), "limits", None) or Limits()
        connections, backlog = connection_plan(limits)
        protocol = type("Protocol", (GuardedH11Protocol,), {
            "limits": limits, "registry": _Connections(connections)})
        on_ready(url_of(sock, host))
        server = uvicorn.Server(uvicorn.Config(
            app, log_level=log_level, lifespan="on", http=protocol, backlog=backlog,
            timeout_keep_alive=limits.keep_alive_s,
            timeout_graceful_shutdown=limits.shutdown_grace_s))
        with _quiet_floods():
            server.run(sockets=[sock])
        if not server.started:
            raise RuntimeError("the server did not start (its log above says why)")
    finally:
        sock.close()
