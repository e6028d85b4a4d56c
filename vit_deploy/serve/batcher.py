"""The request batcher: one worker task collects requests for up to `max_wait_ms` (or
until they hold `max_batch` images) and runs them in a worker thread, one session call per
group of equal-sized images.

One bad request never harms the next: whatever fails is answered to the request(s) it
belongs to (a bad image: 4xx; a failed session run: 500 for that batch only), and the
worker loop itself keeps going. The queue is bounded (503 with Retry-After when full)."""

import asyncio
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vit_deploy.runtime.embedding import normalised, purpose_of
from vit_deploy.runtime.preprocess import group_by_shape
from vit_deploy.runtime.session import InputError
from vit_deploy.serve.errors import Failure, busy, describe
from vit_deploy.serve.metrics import Metrics

log = logging.getLogger(__name__)

QUEUE_BATCHES = 64  # the queue holds at most this many full batches of requests


@dataclass
class Job:
    """One request: image bytes (/predict), or a (B, C, H, W) float32 array and the output
    names to return (v2 infer)."""

    data: Any
    future: asyncio.Future
    outputs: tuple[str, ...] | None = None  # None: a /predict or /embed job
    embed: bool = False  # an /embed job: image bytes in, the embedding out

    @property
    def tensor(self) -> bool:
        return self.outputs is not None

    @property
    def rows(self) -> int:
        return len(self.data) if self.tensor else 1


class Batcher:
    """Collects requests for up to `max_wait_ms` (or until they hold `max_batch` images)
    and runs them in a worker thread: /predict and /embed images and v2 tensors each grouped
    by size, one session call per group and per `max_batch` images (a v2 request's rows may
    span two calls; the three kinds never share one: classified, embedded, raw).

    `start()` and `stop()` run in the serving event loop (the app's lifespan)."""

    def __init__(self, session: Any, *, max_batch: int, max_wait_ms: float, top_k: int,
                 max_queue: int | None = None):
        if max_batch < 1 or max_wait_ms < 0 or (max_queue is not None and max_queue < 1):
            raise ValueError(f"need max_batch >= 1, max_wait_ms >= 0, max_queue >= 1; got "
                             f"{max_batch}, {max_wait_ms}, {max_queue}")
        self.session, self.max_batch, self.max_wait = session, max_batch, max_wait_ms / 1000
        self.max_wait_ms = max_wait_ms
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
        return f"the batch worker died: {describe(exc)}" if exc else "the batch worker ended"

    def queue_depth(self) -> int:
        return self.queue.qsize() if self.queue else 0

    def metric_families(self) -> list[Any]:
        """The Prometheus metric families of this moment (what /metrics writes)."""
        return self.metrics.families(max_batch=self.max_batch, queue_depth=self.queue_depth(),
                                     max_queue=self.max_queue, up=self.stopped() is None)

    def submit(self, image: bytes) -> asyncio.Future:
        """Queue one image; its future gets a result dict or a Failure. Raises Failure(503)
        when the worker is not running or the queue is full."""
        return self._enqueue(Job(image, asyncio.get_running_loop().create_future()))

    def submit_embed(self, image: bytes) -> asyncio.Future:
        """Queue one image for its embedding (runtime/embedding.py: the bundle's embedding
        output, unit length); its future gets a result dict or a Failure."""
        return self._enqueue(Job(image, asyncio.get_running_loop().create_future(), embed=True))

    def submit_tensor(self, pixels: np.ndarray, outputs: tuple[str, ...]) -> asyncio.Future:
        """Queue a (B, C, H, W) batch of B <= max_batch images; its future gets {output
        name: (B, ...) array} for `outputs`, or a Failure. Failure(503) as for submit."""
        if not 1 <= len(pixels) <= self.max_batch:
            raise Failure(400, f"a request holds 1 to {self.max_batch} images (the max batch), "
                               f"got {len(pixels)}")
        return self._enqueue(Job(pixels, asyncio.get_running_loop().create_future(),
                                  tuple(outputs)))

    def _enqueue(self, job: Job) -> asyncio.Future:
        reason = self.stopped()
        if reason or self.queue is None:
            raise Failure(503, f"not serving: {reason}")
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            raise busy(f"{self.max_queue} requests are already waiting (the limit)") from None
        return job.future

    async def run(self) -> None:
        """Forever: collect a batch, answer it. A failure costs only the batch it hit."""
        streak = 0  # unexpected errors in a row: back off so a broken loop does not spin
        while True:
            jobs: list[Job] = []
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
                          describe(e), len(jobs))
                _settle(jobs, Failure(500, f"internal error in the batch worker: {describe(e)}"))
                await asyncio.sleep(min(1.0, 0.001 * 2 ** min(streak, 10)))

    async def _collect(self, jobs: list[Job]) -> None:
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

    async def _answer(self, jobs: list[Job]) -> None:
        live = [j for j in jobs if not j.future.done()]  # a client that went away: skipped
        if not live:
            return
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(None, self._predict, live)
        except Exception as e:  # _predict answers per image and per group; this is a bug there
            self.metrics.count("worker_errors")
            log.error("batch of %d failed outside the session run: %s", len(live), describe(e))
            results = [Failure(500, f"the batch failed: {describe(e)}")] * len(live)
        for job, result in zip(live, results):
            _settle([job], result)

    def _drain(self) -> list[Job]:
        jobs = []
        while self.queue is not None and not self.queue.empty():
            jobs.append(self.queue.get_nowait())
        return jobs

    # worker-thread side

    def _predict(self, jobs: list[Job]) -> list[Any]:
        """One result per job: a dict, or a Failure for that job (or its group)."""
        runs = {"predict": self._classify, "tensor": self._infer, "embed": self._embed}
        rows: dict[str, list[tuple[int, np.ndarray]]] = {kind: [] for kind in runs}
        parts: list[list[Any]] = [[] for _ in jobs]  # each job's per-image results, in order
        for i, job in enumerate(jobs):
            if job.tensor:
                rows["tensor"] += [(i, x) for x in job.data]
            else:
                x = self._prepare(job.data)
                if isinstance(x, Failure):
                    parts[i].append(x)
                else:
                    rows["embed" if job.embed else "predict"].append((i, x))
        for kind, items in rows.items():
            run = runs[kind]
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
                        describe(e))
            return Failure(400, f"image could not be decoded: {describe(e)}")

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
            log.error("inference failed for a batch of %d: %s", n, describe(e))
            return [Failure(500, f"inference failed: {describe(e)}")] * n

    def _embed(self, batch: np.ndarray, n: int) -> list[Any]:
        """n result dicts {"embedding": unit-length vector, ...}, or n times one Failure."""
        purpose = purpose_of(self.session)
        name = purpose.embedding
        try:
            vectors = self._run_all(batch)[name]
            if len(vectors) != n or not np.isfinite(vectors).all():
                return [Failure(500, f"the model gave {len(vectors)} non-finite or missing "
                                     f"embeddings for {n} images: not sent as data")] * n
            return [{"embedding": v.tolist(), "dim": int(v.shape[0]), "output": name,
                     "normalized": True, "similarity": purpose.similarity, "batch_size": n,
                     "provider": self.session.providers[0]} for v in normalised(vectors)]
        except Exception as e:  # as in _classify: only this group hears of it
            log.error("embedding failed for a batch of %d: %s", n, describe(e))
            return [Failure(500, f"inference failed: {describe(e)}")] * n

    def _infer(self, batch: np.ndarray, n: int) -> list[Any]:
        """n dicts {output name: that image's row}, or n times the same Failure(500)."""
        try:
            outputs = self._run_all(batch)
            short = {k: len(v) for k, v in outputs.items() if len(v) != n}
            if short:
                raise RuntimeError(f"session returned {short} rows for {n} images")
            return [{name: value[r] for name, value in outputs.items()} for r in range(n)]
        except Exception as e:  # as in _classify: only this group hears of it
            log.error("inference failed for a batch of %d: %s", n, describe(e))
            return [Failure(500, f"inference failed: {describe(e)}")] * n

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


def _job_result(job: Job, parts: list[Any]) -> Any:
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


def _settle(jobs: list[Job], result: Any) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_result(result)
