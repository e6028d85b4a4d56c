"""The HTTP server: answers, batching, and one bad request never harming the next.

Everything that waits waits for an event (a threading.Event, a semaphore released when a
request is queued, a batch that cannot start before its second request), never for time."""

import asyncio
import contextlib
import io
import logging
import queue
import re
import socket
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient
from PIL import Image

from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.preprocess import ImageError
from vit_deploy.serve.app import make_app
from vit_deploy.serve.limits import MAX_IMAGE_BYTES, MULTIPART_OVERHEAD
from vit_deploy.serve.metrics import CLIENT_GONE, LATENCY_BUCKETS_MS, LatencyStats
from vit_deploy.serve.run import serve

# Every test here runs on the tiny bundle's first kind only (conftest: ONE_TINY_KIND_FILES).
PNG = {"content-type": "image/png"}
LONG_WAIT_MS = 600_000  # with max_batch=2: a batch starts only when its second request is in
CRASH = b"\x89PNG\r\n\x1a\n this payload crashes the decoder"


def _png(value: int, size=(40, 50)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((*size, 3), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


# -- the real command, in a subprocess -----------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_bundle):
    _, result = tiny_bundle
    proc = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "serve", str(result.path),
                             "--port", "0", "--max-batch", "8", "--max-wait-ms", "100",
                             "--top-k", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # Event-driven: `serve` prints its URL (with the port the OS chose) once the socket
    # listens, so the first request is queued, never refused. No polling, no port race.
    line = proc.stdout.readline()
    found = re.search(r" on (http://\S+)", line)
    if not found:
        proc.kill()
        raise RuntimeError(f"serve did not start: {line!r} {proc.stderr.read()}")
    url = found.group(1)
    yield url, result.path
    proc.terminate()
    proc.wait(timeout=10)


def test_predict_health_metadata(server):
    url, bundle = server
    r = httpx.post(f"{url}/predict", content=_png(90), headers={"content-type": "image/png"})
    assert r.status_code == 200
    body = r.json()
    assert len(body["top"]) == 3 and body["provider"] == "CPUExecutionProvider"

    with ViTSession(bundle) as s:  # the server answers what the runtime answers
        expected = s.predict(_png(90), top_k=3)[0]
    assert [t["index"] for t in body["top"]] == [c.index for c in expected.top]
    r = httpx.post(f"{url}/predict", files={"file": ("a.png", _png(90), "image/png")})
    assert r.status_code == 200 and r.json()["top"] == body["top"]
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
    assert httpx.get(f"{url}/metadata").json()["config"]["name"] == "tiny/8"


@pytest.mark.parametrize("kwargs,status,message", [
    (dict(content=b"not an image", headers={"content-type": "image/png"}), 400, "not an image"),
    (dict(content=b"", headers={"content-type": "image/png"}), 400, "empty"),
    (dict(content=b"{}", headers={"content-type": "application/json"}), 415, "content type"),
    (dict(content=b"x" * (20 * 1024 * 1024 + 1), headers={"content-type": "image/png"}), 413,
     "over the limit"),
])
def test_bad_requests_get_4xx_json(server, kwargs, status, message):
    url, _ = server
    r = httpx.post(f"{url}/predict", timeout=60, **kwargs)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


# -- the app, in process -------------------------------------------------------------------


@pytest.fixture
def session(tiny_bundle):
    with ViTSession(tiny_bundle[1].path) as s:
        yield s


@contextlib.contextmanager
def running(session, before=None, **kwargs):
    """(TestClient, Batcher) with the app's lifespan (and so its worker) running;
    `before(batcher)` runs before the worker starts."""
    app = make_app(session, **kwargs)
    if before is not None:
        before(app.state.batcher)
    with TestClient(app) as client:
        yield client, app.state.batcher


def test_concurrent_requests_are_batched(session):
    """With max_batch=4 and LONG_WAIT_MS a batch starts only once its fourth request is
    in: four concurrent requests are one session run of four, however the threads are
    scheduled (no race against the wait)."""
    with running(session, max_batch=4, max_wait_ms=LONG_WAIT_MS) as (client, _):
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda i: client.post(
                "/predict", content=_png(i * 20), headers=PNG), range(4)))
        assert [r.status_code for r in responses] == [200] * 4, [r.text for r in responses]
        assert [r.json()["batch_size"] for r in responses] == [4] * 4
        m = client.get("/stats").json()
        assert (m["requests"], m["batches"], m["batch_sizes"]) == (4, 1, {"4": 1})


def test_a_lone_request_is_answered_when_its_wait_ends(session):
    """The other side of the wait: no company comes, so the batch closes at its deadline
    with one image (whenever that is, the outcome is the same)."""
    with running(session, max_batch=4, max_wait_ms=20) as (client, _):
        r = client.post("/predict", content=_png(7), headers=PNG)
        assert r.status_code == 200 and r.json()["batch_size"] == 1
        assert client.get("/stats").json()["batch_sizes"] == {"1": 1}


def _crash_on(batcher, payload: bytes, exc: BaseException) -> None:
    real = batcher.preprocess

    def preprocess(data):
        if data == payload:
            raise exc
        return real(data)

    batcher.preprocess = preprocess


def _pair(client, first: bytes, second: bytes):
    """Two requests at once; with max_batch=2 and LONG_WAIT_MS they are one batch."""
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(client.post, "/predict", content=c, headers=PNG)
                   for c in (first, second)]
        return [f.result() for f in futures]


DECODER_CRASHES = [NotImplementedError("codec not implemented"),
                   struct.error("unpack requires a buffer of 4 bytes"), MemoryError(),
                   ZeroDivisionError("division by zero"), KeyError("tile"),
                   ImageError("image bytes are not an image format Pillow can read"),
                   ValueError("bad palette")]


@pytest.mark.parametrize("exc", DECODER_CRASHES, ids=lambda e: type(e).__name__)
def test_a_crashing_decoder_costs_only_its_own_request(session, exc):
    with running(session, max_wait_ms=0) as (client, batcher):
        _crash_on(batcher, CRASH, exc)
        r = client.post("/predict", content=CRASH, headers=PNG)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (str(exc) in error) if isinstance(exc, ValueError) else \
            error.startswith(f"image could not be decoded: {type(exc).__name__}")
        r = client.post("/predict", content=_png(90), headers=PNG)
        assert r.status_code == 200 and len(r.json()["top"]) == 5
        assert client.get("/health").status_code == 200
        m = client.get("/stats").json()
        assert (m["errors"], m["requests"], m["worker_errors"]) == (1, 1, 0)


@pytest.mark.parametrize("exc", DECODER_CRASHES[:3], ids=lambda e: type(e).__name__)
def test_a_crashing_decoder_does_not_harm_its_batch_mate(session, exc):
    with running(session, max_batch=2, max_wait_ms=LONG_WAIT_MS) as (client, batcher):
        _crash_on(batcher, CRASH, exc)
        bad, good = _pair(client, CRASH, _png(90))
        assert bad.status_code == 400 and good.status_code == 200, (bad.text, good.text)
        assert client.get("/stats").json()["batches"] == 1  # they were one batch
        assert [r.json()["batch_size"] for r in _pair(client, _png(1), _png(2))] == [2, 2]


def _fail_once(monkeypatch, session, exc):
    real, calls = session.classify, []

    def classify(batch, top_k):
        calls.append(len(batch))
        if len(calls) == 1:
            raise exc
        return real(batch, top_k)

    monkeypatch.setattr(session, "classify", classify)
    return calls


def test_a_failed_session_run_is_500_for_that_request_only(session, monkeypatch, caplog):
    calls = _fail_once(monkeypatch, session, RuntimeError("onnxruntime: out of\nmemory"))
    with running(session, max_wait_ms=0) as (client, _):
        r = client.post("/predict", content=_png(90), headers=PNG)
        assert r.status_code == 500
        assert r.json()["error"] == "inference failed: RuntimeError: onnxruntime: out of memory"
        r = client.post("/predict", content=_png(90), headers=PNG)
        assert r.status_code == 200 and client.get("/health").status_code == 200
    assert calls == [1, 1]
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage() and not errors[0].exc_info


def test_a_failed_session_run_is_500_for_that_batch_only(session, monkeypatch):
    calls = _fail_once(monkeypatch, session, RuntimeError("boom"))
    with running(session, max_batch=2, max_wait_ms=LONG_WAIT_MS) as (client, _):
        assert [r.status_code for r in _pair(client, _png(1), _png(2))] == [500, 500]
        assert [r.status_code for r in _pair(client, _png(1), _png(2))] == [200, 200]
    assert calls == [2, 2]


@pytest.mark.parametrize("where,logged", [("_collect", "continuing"),
                                          ("_predict", "failed outside the session run")])
def test_the_worker_loop_survives_its_own_bugs(session, monkeypatch, caplog, where, logged):
    calls = []

    def break_once(batcher):  # before the worker starts, so its first call is the broken one
        real = getattr(batcher, where)

        async def collect(jobs):
            await real(jobs)
            calls.append(1)
            if len(calls) == 1:
                raise AttributeError("a bug in the loop")

        def predict(images):
            calls.append(1)
            if len(calls) == 1:
                raise AttributeError("a bug in the loop")
            return real(images)

        monkeypatch.setattr(batcher, where, collect if where == "_collect" else predict)

    with running(session, before=break_once, max_wait_ms=0) as (client, _):
        r = client.post("/predict", content=_png(90), headers=PNG)
        assert r.status_code == 500 and "AttributeError: a bug in the loop" in r.json()["error"]
        r = client.post("/predict", content=_png(90), headers=PNG)
        assert r.status_code == 200 and client.get("/health").status_code == 200
        assert client.get("/stats").json()["worker_errors"] == 1
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1 and logged in errors[0].getMessage()
    assert "\n" not in errors[0].getMessage() and not errors[0].exc_info


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.wait([task])


def test_health_is_503_when_the_worker_is_gone(session):
    with running(session) as (client, batcher):
        assert client.get("/health").json()["status"] == "ok"
        client.portal.call(_cancel, batcher.task)
        r = client.get("/health")
        assert r.status_code == 503
        assert r.json() == {"status": "unavailable", "reason": "the batch worker was cancelled"}
        r = client.post("/predict", content=_png(90), headers=PNG)
        assert r.status_code == 503 and "not serving" in r.json()["error"]


def _chunks(total: int, size: int = 1 << 20):
    while total > 0:
        yield b"\0" * min(size, total)
        total -= size


def _multipart(payload: bytes, boundary: str = "b0undary") -> tuple[bytes, dict]:
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n").encode()
    body = head + payload + f"\r\n--{boundary}--\r\n".encode()
    return body, {"content-type": f"multipart/form-data; boundary={boundary}"}


def test_a_generator_body_is_sent_without_content_length():
    request = httpx.Request("POST", "http://x/predict", content=_chunks(10), headers=PNG)
    assert "content-length" not in request.headers
    assert request.headers["transfer-encoding"] == "chunked"


def test_chunked_uploads_over_the_limit_get_413(session):
    over = MAX_IMAGE_BYTES + MULTIPART_OVERHEAD + 1
    with running(session) as (client, _):
        r = client.post("/predict", content=_chunks(over), headers=PNG)
        assert r.status_code == 413 and "over the limit" in r.json()["error"]
        body, headers = _multipart(b"\0" * over)
        r = client.post("/predict", content=iter([body]), headers=headers)
        assert r.status_code == 413 and "over the limit" in r.json()["error"]
        body, headers = _multipart(b"\0" * (MAX_IMAGE_BYTES + 1))  # within the slack
        r = client.post("/predict", content=iter([body]), headers=headers)
        assert r.status_code == 413 and "over the limit" in r.json()["error"]
        good = _png(90)
        r = client.post("/predict", content=iter([good[:10], good[10:]]), headers=PNG)
        assert r.status_code == 200
        body, headers = _multipart(good)
        r = client.post("/predict", content=iter([body]), headers=headers)
        assert r.status_code == 200


def test_multipart_needs_exactly_one_file(session):
    with running(session) as (client, _):
        r = client.post("/predict", files=[("a", ("a.png", _png(1), "image/png")),
                                           ("b", ("b.png", _png(2), "image/png"))])
        assert r.status_code == 400 and "exactly one file" in r.json()["error"]
        r = client.post("/predict", data={"x": "1"}, files=[])
        assert r.status_code in (400, 415)
        r = client.post("/predict", content=b"--x\r\n", headers={
            "content-type": "multipart/form-data"})
        assert r.status_code == 400 and "exactly one file" in r.json()["error"]


def test_latency_stats_use_fixed_memory():
    stats = LatencyStats(window=16)
    for v in (0.5, 1.0, 3.0, 20_000.0):
        stats.add(v)
    buckets = stats.summary()["buckets"]
    assert (buckets["1"], buckets["2.5"], buckets["5"], buckets["10000"], buckets["+Inf"]) == \
        (2, 2, 3, 3, 4)
    for i in range(10_000):
        stats.add(i % 100)
    s = stats.summary()
    assert len(stats.recent) == stats.recent.maxlen == 16 == s["window"]
    assert len(stats.counts) == len(LATENCY_BUCKETS_MS) + 1 == len(s["buckets"])
    assert s["count"] == 10_004 and s["buckets"]["+Inf"] == 10_004
    assert list(s["buckets"].values()) == sorted(s["buckets"].values())


def test_metrics_stay_bounded(session, monkeypatch):
    monkeypatch.setattr("vit_deploy.serve.metrics.LATENCY_WINDOW", 8)
    with running(session, max_wait_ms=0) as (client, batcher):
        for i in range(20):
            assert client.post("/predict", content=_png(i), headers=PNG).status_code == 200
        m = client.get("/stats").json()
    recent = batcher.metrics.latency["predict"].recent
    assert len(recent) == recent.maxlen == 8
    assert {"requests", "images", "batches", "max_batch_seen", "errors", "max_batch",
            "max_wait_ms", "queue_depth", "max_queue", "batch_sizes", "responses"} <= set(m)
    assert m["requests"] == m["images"] == 20 and m["batches"] == 20
    assert m["batch_sizes"] == {"1": 20}
    assert m["responses"] == {"predict": {"200": 20}, "embed": {}, "v2": {}}
    assert len(batcher.metrics.latency["v2"].recent) == 0
    lat = m["latency_ms"]["predict"]
    assert lat["count"] == 20 and lat["window"] == 8 and lat["buckets"]["+Inf"] == 20
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"]


def test_a_full_queue_answers_503_with_retry_after(session, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    queued = threading.Semaphore(0)
    block = _png(200)
    with running(session, max_batch=1, max_wait_ms=0, max_queue=2) as (client, batcher):
        real_preprocess, real_put = batcher.preprocess, batcher.queue.put_nowait

        def preprocess(data):
            if data == block:
                entered.set()
                release.wait()
            return real_preprocess(data)

        def put_nowait(job):
            real_put(job)
            queued.release()

        batcher.preprocess = preprocess
        monkeypatch.setattr(batcher.queue, "put_nowait", put_nowait)

        def post(data):
            return client.post("/predict", content=data, headers=PNG)

        with ThreadPoolExecutor(3) as pool:
            try:
                blocked = pool.submit(post, block)
                assert entered.wait(120), "the worker never started the first request"
                waiting = [pool.submit(post, _png(i)) for i in range(2)]
                for _ in range(3):
                    assert queued.acquire(timeout=120), "a request was never queued"
                r = post(_png(3))
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                assert "busy" in r.json()["error"] and "2 requests" in r.json()["error"]
                m = client.get("/stats").json()
                assert (m["queue_depth"], m["max_queue"]) == (2, 2)
            finally:
                release.set()
            assert [f.result().status_code for f in [blocked, *waiting]] == [200, 200, 200]


def _scope(body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/predict", "raw_path": b"/predict",
            "query_string": b"", "root_path": "", "client": ("test", 1),
            "server": ("test", 80),
            "headers": [(b"content-type", b"image/png"),
                        (b"content-length", str(len(body)).encode())]}


async def _call(app, messages: list[dict]) -> list[dict]:
    """Run one request through the ASGI app; receive() hands out `messages`, then waits."""
    sent, pending = [], list(messages)

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # never: this client says nothing more

    async def send(message):
        sent.append(message)

    await app(_scope(b"x" * 10), receive, send)
    return sent


def test_a_client_that_goes_away_does_not_harm_its_batch(session, caplog):
    """Its job is collected with the next request's, skipped, and nothing is logged."""
    with running(session, max_batch=2, max_wait_ms=LONG_WAIT_MS) as (client, _):
        app = client.app
        sent = client.portal.call(_call, app, [
            {"type": "http.request", "body": _png(1), "more_body": False},
            {"type": "http.disconnect"}])
        assert sent[0]["status"] == CLIENT_GONE
        r = client.post("/predict", content=_png(2), headers=PNG)
        assert r.status_code == 200 and r.json()["batch_size"] == 1
        m = client.get("/stats").json()
        assert (m["disconnects"], m["errors"], m["worker_errors"]) == (1, 0, 0)
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING or rec.exc_info]


def test_a_disconnect_while_uploading_is_not_an_error(session, caplog):
    with running(session) as (client, _):
        sent = client.portal.call(_call, client.app, [
            {"type": "http.request", "body": b"\x89PNG", "more_body": True},
            {"type": "http.disconnect"}])
        assert sent[0]["status"] == CLIENT_GONE
        assert client.post("/predict", content=_png(2), headers=PNG).status_code == 200
        assert client.get("/stats").json()["disconnects"] == 1
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING or rec.exc_info]


async def _cancel_while_waiting(app, batcher) -> list[dict]:
    queued = asyncio.Event()
    real_put = batcher.queue.put_nowait

    def put_nowait(job):
        real_put(job)
        queued.set()

    batcher.queue.put_nowait = put_nowait
    try:
        task = asyncio.ensure_future(_call(app, [
            {"type": "http.request", "body": _png(1), "more_body": False}]))
        await queued.wait()
        await _cancel(task)
        return task.result()
    finally:
        del batcher.queue.put_nowait


def test_a_cancelled_request_does_not_harm_its_batch(session, caplog):
    """uvicorn cancels handlers only at shutdown: answered 503, its job skipped, no log."""
    with running(session, max_batch=2, max_wait_ms=LONG_WAIT_MS) as (client, batcher):
        sent = client.portal.call(_cancel_while_waiting, client.app, batcher)
        assert sent[0]["status"] == 503 and b"shutting down" in sent[1]["body"]
        r = client.post("/predict", content=_png(2), headers=PNG)
        assert r.status_code == 200 and r.json()["batch_size"] == 1
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING or rec.exc_info]


# -- serve(): bind first, then say so, then run --------------------------------------------


def test_serve_reports_a_port_in_use_before_saying_it_serves():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ready = []
        with pytest.raises(OSError, match=f"127.0.0.1:{port}: port {port} is already in use"):
            serve(object(), "127.0.0.1", port, on_ready=ready.append)
        assert ready == []


def test_serve_reports_an_address_that_is_not_ours():
    ready = []
    with pytest.raises(OSError, match="203.0.113.7 is not an address of this machine"):
        serve(object(), "203.0.113.7", 0, on_ready=ready.append)
    assert ready == []


def test_serve_binds_then_calls_on_ready_then_serves(session, monkeypatch):
    servers: list[uvicorn.Server] = []

    class Recording(uvicorn.Server):
        def __init__(self, config):
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(uvicorn, "Server", Recording)
    ready: queue.Queue = queue.Queue()
    thread = threading.Thread(target=serve, args=(make_app(session), "127.0.0.1", 0),
                              kwargs={"on_ready": ready.put}, daemon=True)
    thread.start()
    url = ready.get(timeout=120)
    try:
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        with httpx.Client(base_url=url, timeout=120) as http:
            assert http.get("/health").json()["status"] == "ok"  # the backlog held it
            r = http.post("/predict", content=_chunks(MAX_IMAGE_BYTES + (2 << 20)),
                          headers=PNG)
            assert r.status_code == 413 and "over the limit" in r.json()["error"]
            assert http.post("/predict", content=_png(9), headers=PNG).status_code == 200
    finally:
        for s in servers:
            s.should_exit = True
        thread.join(120)
    assert not thread.is_alive()
