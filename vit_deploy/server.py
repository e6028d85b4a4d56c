"""`vit-deploy serve`: a small HTTP server for one machine, with request batching.

POST /predict (raw image bytes or multipart), GET /health, /metadata, /metrics. Needs the
`serve` extra (FastAPI, uvicorn, python-multipart). FastAPI reads the endpoint
annotations at run time, so this module does not use postponed annotations.
"""

import asyncio
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from vit_deploy.runtime.preprocess import ImageError, group_by_shape

MAX_IMAGE_BYTES = 20 * 1024 * 1024


@dataclass
class Metrics:
    requests: int = 0
    images: int = 0
    batches: int = 0
    max_batch_seen: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)


class Batcher:
    """Collects requests for up to `max_wait_ms` (or `max_batch` of them) and runs them as
    one session call per same-size group, in a worker thread."""

    def __init__(self, session: Any, *, max_batch: int, max_wait_ms: float, top_k: int):
        self.session, self.max_batch, self.max_wait = session, max_batch, max_wait_ms / 1000
        self.top_k = top_k
        self.queue: asyncio.Queue = asyncio.Queue()
        self.metrics = Metrics()
        self.preprocess = session.preprocess()
        self._lock = threading.Lock()

    async def submit(self, image: bytes) -> dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((image, future))
        return await future

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = [await self.queue.get()]
            deadline = loop.time() + self.max_wait
            while len(items) < self.max_batch:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    items.append(await asyncio.wait_for(self.queue.get(), remaining))
                except asyncio.TimeoutError:
                    break
            results = await loop.run_in_executor(None, self._predict, [i[0] for i in items])
            for (_, future), result in zip(items, results):
                if not future.done():
                    future.set_result(result)

    def _predict(self, images: list) -> list:
        out: list[dict[str, Any]] = [{} for _ in images]
        arrays = []
        for i, data in enumerate(images):
            try:
                arrays.append((i, self.preprocess(data)))
            except ImageError as e:
                out[i] = {"error": str(e), "status": 400}
        for indices, batch in group_by_shape(arrays):
            with self._lock:
                self.metrics.batches += 1
                self.metrics.max_batch_seen = max(self.metrics.max_batch_seen, len(indices))
            for top, i in zip(self.session.classify(batch, self.top_k), indices):
                out[i] = {"top": [asdict(c) for c in top], "batch_size": len(indices),
                          "provider": self.session.providers[0]}
        return out


def make_app(session: Any, *, max_batch: int = 8, max_wait_ms: float = 5.0, top_k: int = 5):
    """A FastAPI app: POST /predict, GET /health, /metadata, /metrics."""
    batcher = Batcher(session, max_batch=max_batch, max_wait_ms=max_wait_ms, top_k=top_k)
    app = FastAPI(title="vit-deploy", docs_url=None, redoc_url=None)

    @app.on_event("startup")
    async def _start() -> None:
        app.state.task = asyncio.create_task(batcher.run())

    def error(status: int, message: str) -> JSONResponse:
        batcher.metrics.errors += 1
        return JSONResponse({"error": message}, status_code=status)

    @app.post("/predict")
    async def predict(request: Request):
        t0 = time.perf_counter()
        ctype = request.headers.get("content-type", "")
        length = int(request.headers.get("content-length") or 0)
        if length > MAX_IMAGE_BYTES:
            return error(413, f"image of {length} bytes is over the limit of {MAX_IMAGE_BYTES}")
        if ctype.startswith("multipart/form-data"):
            form = await request.form()
            files = [v for v in form.values() if hasattr(v, "read")]
            if len(files) != 1:
                return error(400, f"send exactly one file part, got {len(files)}")
            data = await files[0].read()
        elif ctype.startswith(("image/", "application/octet-stream")):
            data = await request.body()
        else:
            return error(415, f"content type must be an image/*, application/octet-stream or "
                              f"multipart/form-data, got {ctype or 'none'!r}")
        if len(data) > MAX_IMAGE_BYTES:
            return error(413, f"image of {len(data)} bytes is over the limit of {MAX_IMAGE_BYTES}")
        if not data:
            return error(400, "empty request body: send an image")
        result = await batcher.submit(data)
        if "error" in result:
            return error(result["status"], result["error"])
        batcher.metrics.requests += 1
        batcher.metrics.images += 1
        batcher.metrics.latencies_ms.append((time.perf_counter() - t0) * 1000)
        return result

    @app.get("/health")
    async def health():
        return {"status": "ok", "providers": session.providers}

    @app.get("/metadata")
    async def metadata():
        return session.manifest or {"config": session.config}

    @app.get("/metrics")
    async def metrics():
        m = batcher.metrics
        return {"requests": m.requests, "images": m.images, "batches": m.batches,
                "max_batch_seen": m.max_batch_seen, "errors": m.errors,
                "max_batch": max_batch, "max_wait_ms": max_wait_ms}

    return app
