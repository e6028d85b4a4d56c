"""`serve` against hostile clients (issue 24): half-open connections, slow bodies, huge
declared sizes, decompression bombs, non-finite numbers, wrong JSON types, SIGTERM during
uploads. Servers run in a subprocess on 127.0.0.1 with ~1 s timeouts; every loop and wait
is bounded."""

import io
import json
import logging
import math
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from vit_deploy.runtime import ViTSession
from vit_deploy.serve.app import make_app, serving_model
from vit_deploy.serve.codec import parse_infer_request
from vit_deploy.serve.connections import RepeatFilter
from vit_deploy.serve.errors import Failure
from vit_deploy.serve.limits import MAX_INFER_BYTES, BodyBudget, Limits

PNG = {"content-type": "image/png"}
FAST = dict(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1.0, shutdown_grace_s=1.0)

SCRIPT = """
import json, resource, sys
args = json.loads(sys.argv[1])
if args.get("nofile"):
    resource.setrlimit(resource.RLIMIT_NOFILE, (args["nofile"], args["nofile"]))
from vit_deploy.runtime import ViTSession
from vit_deploy.serve.app import make_app
from vit_deploy.serve.limits import Limits
from vit_deploy.serve.run import serve
app = make_app(ViTSession(args["bundle"]), max_batch=2, max_wait_ms=1,
               limits=Limits(**args["limits"]))
serve(app, "127.0.0.1", 0, on_ready=lambda url: print(url, flush=True))
"""


@contextmanager
def hostile_server(bundle, nofile=None, **limits):
    """(url, port, proc) of a real server in a subprocess; stops it with SIGTERM."""
    args = json.dumps({"bundle": str(bundle), "limits": FAST | limits, "nofile": nofile})
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line.startswith("http://"):
            proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {proc.stderr.read()[-3000:]}")
        yield line, int(line.rsplit(":", 1)[1]), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _connect(port: int, data: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data:
        s.sendall(data)
    return s


def _closed_by_server(socks: list[socket.socket], within: float) -> tuple[int, list[bytes]]:
    """How many of `socks` the server answered or closed within `within` seconds, and what
    it sent each (b"" for a plain close or a reset)."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    sent: list[bytes] = []
    deadline = time.monotonic() + within
    while by_fd and time.monotonic() < deadline:
        for fd, _ in poller.poll(200):
            s = by_fd.pop(fd, None)
            if s is None:
                continue
            poller.unregister(fd)
            data = b""
            try:
                s.settimeout(1)
                while not data.endswith(b"}") and len(data) < 65536:
                    more = s.recv(65536)
                    if not more:
                        break
                    data += more
            except OSError:  # reset, or nothing more within the second
                pass
            sent.append(data)
    return len(sent), sent


def _health_within(url: str, seconds: float) -> None:
    t0 = time.monotonic()
    r = httpx.get(f"{url}/health", timeout=seconds)
    assert r.status_code == 200 and time.monotonic() - t0 < seconds


@pytest.fixture
def bundle(tiny_bundle):
    return tiny_bundle[1].path


# -- connections ------------------------------------------------------------------------------


def test_half_open_connections_are_bounded_and_closed_after_the_header_timeout(bundle):
    with hostile_server(bundle, max_connections=64) as (url, port, _):
        partial = [_connect(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                   for _ in range(150)]
        silent = [_connect(port) for _ in range(50)]
        for _ in range(5):  # 200 half-open connections, the limit 64: health still answers
            _health_within(url, 2.0)
        survivors = [s for s in partial + silent if s.fileno() >= 0]
        closed, sent = _closed_by_server(survivors, within=5.0)
        assert closed == len(survivors)  # every one: evicted, or closed by the header timeout
        timeouts = [d for d in sent if d.startswith(b"HTTP/1.1 408")]
        assert timeouts and all(b"header timeout" in d for d in timeouts)
        _health_within(url, 2.0)
        for s in partial + silent:
            s.close()


def test_a_low_descriptor_limit_is_not_exhausted_and_logs_stay_small(bundle):
    # 128 descriptors; 256 half-open connections (more past the accept backlog only wait
    # for SYN retries, a second each): the cap (under the limit) holds, no "Too many open
    # files", and the log is a few lines.
    with hostile_server(bundle, nofile=128) as (url, port, proc):
        socks = [_connect(port, b"POST /predict HTTP/1.1\r\n") for _ in range(256)]
        _health_within(url, 2.0)
        for s in socks:
            s.close()
        _health_within(url, 2.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "Too many open files" not in err and "Traceback" not in err
    assert len(err) < 5000, err[-2000:]


@pytest.mark.parametrize("drip", [None, 0.25], ids=["stalled", "dripping"])
def test_a_slow_body_is_answered_408_and_closed(bundle, drip):
    with hostile_server(bundle) as (url, port, _):
        s = _connect(port, b"POST /predict HTTP/1.1\r\nHost: x\r\ncontent-type: image/png\r\n"
                           b"content-length: 100000\r\n\r\n" + b"\x89PNG")
        t0 = time.monotonic()
        if drip:  # a byte every 0.25 s: the deadline is for the whole body, not per byte
            with pytest.raises(OSError):
                while time.monotonic() - t0 < 5:
                    time.sleep(drip)
                    s.sendall(b"x")
        closed, sent = _closed_by_server([s], within=5.0)
        assert closed == 1 and time.monotonic() - t0 < 4
        if not drip:
            assert sent[0].startswith(b"HTTP/1.1 408") and b"body timeout" in sent[0]
        for _ in range(20):  # the handler hears of the close a moment later
            stats = httpx.get(f"{url}/stats").json()
            if stats["responses"]["predict"].get("408"):
                break
            time.sleep(0.1)
        assert stats["responses"]["predict"].get("408") == 1
        _health_within(url, 2.0)


@pytest.mark.parametrize("path,ctype", [("/predict", "image/png"),
                                        ("/v2/models/tiny-learned-cls/infer",
                                         "application/json")])
@pytest.mark.parametrize("declared", [10 ** 10, 64 * 1024 * 1024 + 1, 20 * 1024 * 1024 + 1])
def test_a_huge_declared_body_is_refused_before_it_is_read(bundle, path, ctype, declared):
    with hostile_server(bundle) as (url, port, _):
        s = _connect(port, f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: {ctype}\r\n"
                           f"content-length: {declared}\r\n\r\n".encode())
        closed, sent = _closed_by_server([s], within=0.8)  # before the body timeout
        if path == "/predict" or declared > MAX_INFER_BYTES:
            assert sent and sent[0].startswith(b"HTTP/1.1 413"), sent
            assert b"over the limit" in sent[0]
        else:  # within the limit: the server waits for the body
            assert closed == 0
        s.close()


def _slow_openings(model: str) -> list[bytes]:
    """Headers and the first bytes of a 100000-byte body, for each inference endpoint: raw
    /predict, multipart /predict, v2 JSON infer."""
    head = "POST {} HTTP/1.1\r\nHost: x\r\ncontent-type: {}\r\ncontent-length: 100000\r\n\r\n"
    return [head.format("/predict", "image/png").encode() + b"\x89PNG",
            head.format("/predict", "multipart/form-data; boundary=b0").encode() + b"--b0\r\n",
            head.format(f"/v2/models/{model}/infer", "application/json").encode()
            + b'{"inputs":[']


@contextmanager
def _dripping(socks: list[socket.socket], every: float | None):
    """A byte to each of `socks` every `every` seconds (None: nothing more) meanwhile,
    until the server answers or closes it (as a client would: no reset)."""
    stop = threading.Event()

    def drip():
        live = list(socks)
        while live and not stop.wait(every):
            answered = select.select(live, [], [], 0)[0]
            live = [s for s in live if s not in answered]
            for s in live:
                try:
                    s.send(b"0")
                except OSError:  # closed meanwhile: what the tests wait for
                    pass

    thread = threading.Thread(target=drip, daemon=True)
    if every:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if every:
            thread.join(5)


def _fast_requests_answer(url: str, model: str, within: float) -> None:
    """Each inference endpoint answers a whole request 200 within `within` seconds."""
    v2 = json.dumps(_request()).encode()
    for how in (dict(content=_png(), headers=PNG),
                dict(files={"file": ("a.png", _png(), "image/png")})):
        t0 = time.monotonic()
        r = httpx.post(f"{url}/predict", timeout=within, **how)
        assert r.status_code == 200 and time.monotonic() - t0 < within, r.text
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v2/models/{model}/infer", content=v2, timeout=within)
    assert r.status_code == 200 and time.monotonic() - t0 < within, r.text


def _predict_408s(url: str, want: int) -> int:
    for _ in range(30):  # the handlers hear of the closes a moment later
        got = httpx.get(f"{url}/stats").json()["responses"]
        n = sum(got.get(e, {}).get("408", 0) for e in ("predict", "v2"))
        if n >= want:
            break
        time.sleep(0.1)
    return n


@pytest.mark.parametrize("drip", [None, 0.2], ids=["stalled", "dripping"])
def test_slow_bodies_never_keep_fast_requests_out(bundle, drip):
    # 12 slow bodies, three times the 4 bodies parsed at once and each declaring 100000
    # bytes (the byte budget 300000): they hold no slot and no declared bytes, so fast
    # requests to every endpoint are answered 200 while they are open; then each gets 408.
    limits = dict(max_bodies=4, max_body_bytes=300_000, max_image_bytes=200_000,
                  max_infer_bytes=200_000, body_timeout_s=6.0, min_body_rate=1,
                  body_window_s=10.0)  # no rate check before the body timeout
    with hostile_server(bundle, **limits) as (url, port, proc):
        slow = [_connect(port, opening) for opening in _slow_openings(bundle.name) * 4]
        t0 = time.monotonic()
        with _dripping(slow, drip):
            time.sleep(0.3)  # every body is being read
            for _ in range(2):
                _fast_requests_answer(url, bundle.name, within=2.0)
            _health_within(url, 2.0)
            assert time.monotonic() - t0 < 5.5  # all of it while the slow ones were open
            closed, sent = _closed_by_server(slow, within=8.0)  # 6 s from their headers
        assert closed == len(slow) and time.monotonic() - t0 < 8
        assert all(d.startswith(b"HTTP/1.1 408") and b"body timeout" in d for d in sent), sent
        assert _predict_408s(url, len(slow)) == len(slow)
        _fast_requests_answer(url, bundle.name, within=2.0)  # and it lives on
        for s in slow:
            s.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and len(err) < 5000, err[-3000:]


def test_a_trickle_is_cut_by_the_minimum_rate_and_a_steady_slow_body_is_not(bundle):
    limits = dict(body_timeout_s=20.0, min_body_rate=1000, body_window_s=0.5)
    with hostile_server(bundle, **limits) as (url, port, _):
        stalled = [_connect(port, opening) for opening in _slow_openings(bundle.name)]
        dripped = [_connect(port, opening) for opening in _slow_openings(bundle.name)]
        image = _png(size=(60, 60))
        assert len(image) > 5000
        steady = _connect(port, b"POST /predict HTTP/1.1\r\nHost: x\r\ncontent-type: image/png"
                                b"\r\ncontent-length: %d\r\n\r\n" % len(image))

        def send_steadily():  # 2000 bytes/s, over the 1000: 3 s or more in all
            for i in range(0, len(image), 200):
                steady.sendall(image[i:i + 200])
                time.sleep(0.1)

        sender = threading.Thread(target=send_steadily, daemon=True)
        t0 = time.monotonic()
        sender.start()
        with _dripping(dripped, 0.05):  # 20 bytes/s, under the 1000
            closed, sent = _closed_by_server(stalled + dripped, within=3.0)
        assert closed == 6 and time.monotonic() - t0 < 3  # long before the body timeout
        assert all(d.startswith(b"HTTP/1.1 408") and b"minimum body rate" in d for d in sent)
        sender.join(15)
        answer = b""
        while not answer.endswith(b"}"):
            answer += steady.recv(65536) or b"}"
        assert answer.startswith(b"HTTP/1.1 200") and b'"top"' in answer, answer
        _fast_requests_answer(url, bundle.name, within=2.0)


@pytest.mark.parametrize("drip", [None, 0.2], ids=["stalled", "dripping"])
def test_at_the_connection_limit_the_slowest_body_makes_way(bundle, drip):
    # Every one of the 8 connections is sending a slow body (each being answered, none
    # idle): a new connection closes the one that has been sending longest, with a 408.
    limits = dict(max_connections=8, body_timeout_s=20.0, min_body_rate=1, body_window_s=30.0)
    with hostile_server(bundle, **limits) as (url, port, _):
        slow = []
        for opening in (_slow_openings(bundle.name) * 3)[:8]:
            slow.append(_connect(port, opening))
            time.sleep(0.05)  # in order: slow[0] has been sending longest
        with _dripping(slow, drip):
            time.sleep(0.3)
            for _ in range(2):
                _fast_requests_answer(url, bundle.name, within=2.0)
            _health_within(url, 2.0)
            first, sent = _closed_by_server(slow[:1], within=1.0)
            closed, more = _closed_by_server(slow[1:], within=0.5)
        assert first == 1 and closed < len(slow) - 1  # the oldest made way, not all of them
        assert all(d.startswith(b"HTTP/1.1 408") and b"slowest to arrive" in d
                   for d in sent + more), sent + more
        for s in slow:
            s.close()
        _fast_requests_answer(url, bundle.name, within=2.0)


@pytest.mark.parametrize("declared", [9000, 10_000])
def test_bytes_held_are_what_arrived_not_what_was_declared(bundle, declared):
    limits = dict(max_image_bytes=10_000, max_infer_bytes=10_000, max_body_bytes=15_000,
                  body_timeout_s=4.0, body_window_s=10.0)
    head = (b"POST /predict HTTP/1.1\r\nHost: x\r\ncontent-type: image/png\r\n"
            b"content-length: %d\r\n\r\n" % declared)
    with hostile_server(bundle, **limits) as (url, port, _):
        big = _png(size=(50, 50))
        assert 6000 < len(big) < 10_000
        declaring = [_connect(port, head + b"abc") for _ in range(8)]  # 8 x declared, 3 sent
        time.sleep(0.3)
        r = httpx.post(f"{url}/predict", content=big, headers=PNG, timeout=5)
        assert r.status_code == 200, r.text  # a promise holds nothing
        holding = _connect(port, head + b"x" * (declared - 1000))  # sent: held
        time.sleep(0.3)
        r = httpx.post(f"{url}/predict", content=big, headers=PNG, timeout=5)
        assert r.status_code == 503 and "bytes of requests are held" in r.json()["error"]
        assert r.headers["retry-after"] == "1"
        small = _png(size=(20, 20))
        assert httpx.post(f"{url}/predict", content=small, headers=PNG,
                          timeout=10).status_code == 200  # it fits beside the held bytes
        holding.close()
        time.sleep(0.3)
        assert httpx.post(f"{url}/predict", content=big, headers=PNG,
                          timeout=10).status_code == 200
        for s in declaring:
            s.close()


def test_a_body_takes_a_parsing_slot_only_once_it_has_arrived():
    budget = BodyBudget(max_bodies=2, max_bytes=1000)
    arriving = [budget.claim() for _ in range(50)]  # any number may be arriving
    for c in arriving:
        c.need(10)
    assert budget.bodies == 0 and budget.bytes == 500
    done = [budget.claim() for _ in range(3)]
    done[0].arrived()
    done[1].arrived()
    with pytest.raises(Failure, match="2 request bodies are being parsed") as e:
        done[2].arrived()
    assert e.value.status == 503 and e.value.headers["Retry-After"] == "1"
    done[0].parsed()
    done[2].arrived()  # a slot came back
    with pytest.raises(Failure, match="bytes of requests are held"):
        done[1].fits(600)  # a declared length that cannot fit: 503 before reading
    assert budget.bytes == 500  # and nothing reserved
    for c in arriving + done:
        c.release()
    assert (budget.bodies, budget.bytes) == (0, 0)


def test_sigterm_during_slow_uploads_shuts_down_without_tracebacks(bundle):
    with hostile_server(bundle, body_timeout_s=30.0) as (url, port, proc):
        socks = [_connect(port, b"POST /predict HTTP/1.1\r\nHost: x\r\ncontent-type: "
                                b"image/png\r\ncontent-length: 100000\r\n\r\n\x89PNG")
                 for _ in range(20)]
        socks += [_connect(port, f"POST /v2/models/{bundle.name}/infer HTTP/1.1\r\nHost: x\r\n"
                                 f"content-length: 100000\r\n\r\n{{\"inputs\":[".encode())
                  for _ in range(20)]
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 10
        for s in socks:
            s.close()
    assert "Traceback" not in err and "Exception in ASGI" not in err, err[-3000:]


def test_repeated_log_lines_are_throttled():
    now = [0.0]
    flt = RepeatFilter(every=10, clock=lambda: now[0])
    logger = logging.getLogger("test.flood")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger.addHandler(Keep())
    logger.addFilter(flt)
    logger.propagate = False
    try:
        for i in range(2500):
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                logger.error("socket.accept() out of system resource", exc_info=True)
            logger.warning("Invalid HTTP request received.")
            now[0] += 0.01  # 25 s in all
        assert len(records) == 6  # each message: first, after 10 s, after 20 s
        repeats = [r for r in records if "repeated" in r.getMessage()]
        assert len(repeats) == 4 and all(r.exc_info is None for r in repeats)
        assert re.search(r"(999|1000) more like this", repeats[0].getMessage())
    finally:
        logger.removeFilter(flt)
        logger.handlers.clear()


# -- sizes before decoding ----------------------------------------------------------------------


def _png(value: int = 90, size=(40, 50)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(value).integers(0, 255, (*size, 3), np.uint8)
                    ).save(buf, format="PNG")
    return buf.getvalue()


def _png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header says width x height (the IHDR's CRC fixed up)."""
    data = bytearray(_png(size=(2, 2)))
    ihdr = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


def _gif_claiming(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, format="GIF")
    data = bytearray(buf.getvalue())
    data[6:10] = struct.pack("<HH", width, height)
    return bytes(data)


@pytest.fixture
def app_client(tiny_bundle):
    with ViTSession(tiny_bundle[1].path) as session:
        def start(**limits):
            app = make_app(session, max_batch=2, max_wait_ms=1,
                               limits=Limits(**limits))
            return TestClient(app)
        yield start


@pytest.mark.parametrize("image,limit,shown", [
    (_png_claiming(9000, 9000), None, "9000x9000"),
    (_png_claiming(60000, 60000), None, "60000"),  # past Pillow's own bomb guard too
    (_png_claiming(24_000_001, 1), None, "24000001x1"),
    (_gif_claiming(9000, 9000), None, "9000x9000"),
    (_png(size=(100, 100)), 5000, "100x100"),
    (_png(size=(71, 71)), 5000, "71x71"),
], ids=["png-9000", "png-60000", "strip", "gif-9000", "png-100-limit-5000", "png-71-limit-5000"])
def test_images_too_large_by_their_header_are_refused_before_decoding(app_client, monkeypatch,
                                                                      image, limit, shown):
    client = app_client(**({"max_image_pixels": limit} if limit else {}))
    decoded = []
    with client:
        real = client.app.state.batcher.preprocess
        client.app.state.batcher.preprocess = lambda d: decoded.append(d) or real(d)
        r = client.post("/predict", content=image, headers=PNG)
        assert r.status_code == 413 and shown in r.json()["error"], r.text
        r = client.post("/predict", files={"file": ("a.png", image, "image/png")})
        assert r.status_code == 413
        assert decoded == []  # never reached the decoder
        assert client.post("/predict", content=_png(size=(70, 70)), headers=PNG).status_code == 200


# -- the Open Inference Protocol: numbers and types -------------------------------------------


def _strict_json(text: str):
    def refuse(token):
        raise AssertionError(f"invalid JSON token {token} in a response")
    return json.loads(text, parse_constant=refuse)


def _request(name="pixel_values", data=None, shape=(1, 3, 48, 64), **extra):
    n = math.prod(shape)
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": list(shape),
                        "data": [0.25] * n if data is None else data}], **extra}


NON_FINITE_TEXT = ["NaN", "Infinity", "-Infinity", "1e39", "-1e39", "1e309", "3.5e38"]


@pytest.mark.parametrize("token", NON_FINITE_TEXT)
@pytest.mark.parametrize("where", [0, 5, 9215])
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_non_finite_inputs_are_refused_with_valid_json(app_client, token, where, nested):
    values = ["0.5"] * 9216
    values[where] = token
    text = "[" + ",".join(values) + "]"
    if nested:  # rows of 64: each row stays in the JSON, short of the numpy path
        rows = ["[" + ",".join(values[i:i + 64]) + "]" for i in range(0, 9216, 64)]
        text = "[[[" + "],[".join(",".join(rows[c * 48:(c + 1) * 48]) for c in range(3)) + "]]]"
    body = ('{"inputs":[{"name":"pixel_values","datatype":"FP32","shape":[1,3,48,64],'
            '"data":' + text + '}]}')
    with app_client() as client:
        r = client.post("/v2/models/tiny-learned-cls/infer", content=body)
        assert r.status_code == 400, r.text
        error = _strict_json(r.text)["error"]
        assert "not finite FP32 numbers" in error and "expected finite numbers" in error
        assert f"index [0, {where // 3072}, {where % 3072 // 64}, {where % 64}]" in error


@pytest.mark.parametrize("bits", [np.nan, np.inf, -np.inf])
def test_non_finite_binary_inputs_are_refused(app_client, bits):
    x = np.zeros((1, 3, 48, 64), np.float32)
    x[0, 2, 47, 63] = bits
    header = json.dumps({"inputs": [{"name": "pixel_values", "datatype": "FP32",
                                     "shape": [1, 3, 48, 64],
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    with app_client() as client:
        r = client.post("/v2/models/tiny-learned-cls/infer", content=header + x.tobytes(),
                        headers={"Inference-Header-Content-Length": str(len(header))})
        assert r.status_code == 400 and "[0, 2, 47, 63]" in _strict_json(r.text)["error"]


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_output_is_an_error_not_data(app_client, monkeypatch, binary, bad):
    with app_client() as client:
        session = client.app.state.batcher.session
        real = session.run_all

        def run_all(x):
            out = real(x)
            return {k: np.full_like(v, bad) for k, v in out.items()}

        monkeypatch.setattr(session, "run_all", run_all)
        monkeypatch.setattr(session, "classify", lambda b, k: [[
            type("C", (), {"index": 0, "label": None, "probability": float(bad)})()]] * len(b))
        body = _request(parameters={"binary_data_output": binary})
        r = client.post("/v2/models/tiny-learned-cls/infer", json=body)
        assert r.status_code == 500 and "non-finite" in _strict_json(r.text)["error"]
        r = client.post("/predict", content=_png(), headers=PNG)
        assert r.status_code == 500 and "non-finite" in _strict_json(r.text)["error"]


WRONG_TYPES = [5, 1.5, True, None, [], ["pixel_values"], {}, {"a": 1}]


@pytest.mark.parametrize("value", WRONG_TYPES, ids=repr)
@pytest.mark.parametrize("where", ["input", "output"])
def test_names_of_the_wrong_json_type_are_400_saying_expected_and_given(app_client, value,
                                                                        where):
    body = _request()
    if where == "input":
        body["inputs"][0]["name"] = value
    else:
        body["outputs"] = [{"name": value}]
    with app_client() as client:
        r = client.post("/v2/models/tiny-learned-cls/infer", json=body)
    assert r.status_code == 400, r.text
    error = _strict_json(r.text)["error"]
    assert f"{where}s[0].name must be a string" in error and "got " in error


def _fields(request: dict):
    """(path, setter) for every field of a request, nested fields included."""
    def walk(node, path):
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in list(items):
            yield path + (k,), node, k
            if isinstance(v, (dict, list)) and not (k == "data"):
                yield from walk(v, path + (k,))
    yield from walk(request, ())


def test_every_field_of_every_wrong_type_is_a_4xx_never_a_500(tiny_bundle):
    with ViTSession(tiny_bundle[1].path) as session:
        model = serving_model(session)
    base = _request(shape=(1, 3, 8, 8), id="r1", parameters={"binary_data_output": False},
                    outputs=[{"name": "logits", "parameters": {"binary_data": False}}])
    tried = 0
    for value in WRONG_TYPES + ["text", -1, 10 ** 30, float("nan")]:
        for path, _, _ in list(_fields(base)):
            request = json.loads(json.dumps(base))
            node = request
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = value
            body = json.dumps(request).encode()
            tried += 1
            try:
                parse_infer_request(body, None, model, max_batch=4)
            except Failure as f:
                assert 400 <= f.status < 500 and f.message, (path, value)
    assert tried > 150


# -- JSON tensor data: parsed straight into arrays ---------------------------------------------


@pytest.mark.parametrize("shape", [(1, 3, 8, 8), (2, 3, 16, 24), (4, 3, 8, 40)])
@pytest.mark.parametrize("layout", ["flat", "nested", "rows-of-8"])
@pytest.mark.parametrize("spacing", ["", " ", "\n  "])
def test_json_data_parses_to_what_json_says(tiny_bundle, shape, layout, spacing):
    with ViTSession(tiny_bundle[1].path) as session:
        model = serving_model(session)
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    if layout == "flat":
        data = x.ravel().tolist()
    elif layout == "nested":
        data = x.tolist()
    else:
        data = x.reshape(-1, 8).tolist()  # nesting other than the shape's: as Triton, counted
    text = json.dumps(_request(data=data, shape=shape), indent=1 if spacing else None)
    if spacing:
        text = text.replace(",", "," + spacing)
    got = parse_infer_request(text.encode(), None, model, max_batch=4).inputs[
        "pixel_values"]
    want = np.asarray(json.loads(text)["inputs"][0]["data"], np.float32).reshape(shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("data,message", [
    ("[" + ",".join(["0.5"] * 191) + "]", "holds 191 values"),
    ("[" + ",".join(["0.5"] * 193) + "]", "holds 193 values"),
    ("[" + ",".join(["0.5"] * 191) + ",]", "holds 19|could not be read as numbers|not valid JSON"),
    ("[" + ",".join(["0.5"] * 190) + ",,0.5]", "holds 19|could not be read as numbers|not valid JSON"),
    ("[" + ",".join(["0.5"] * 190) + ",,]", "could not be read as numbers|not valid JSON"),
    ("[" + ",".join(["0.5"] * 190) + ",\"x\",1]", "got a string"),
    ("[" + ",".join(["0.5"] * 190) + ",true,1]", "got a boolean"),
    ("[" + ",".join(["0.5"] * 190) + ",null,1]", "got null"),
    ("[" + ",".join(["1e5e5"] * 192) + "]", "could not be read as numbers"),
    ("[" + ",".join(["--1"] * 192) + "]", "could not be read as numbers"),
    ("[[" + ",".join(["0.5"] * 96) + "],[" + ",".join(["0.5"] * 95) + "],[1]]", "ragged"),
    ("\"" + "1," * 191 + "1\"", "got a string"),
])
def test_malformed_json_data_is_400(tiny_bundle, data, message):
    with ViTSession(tiny_bundle[1].path) as session:
        model = serving_model(session)
    body = ('{"inputs":[{"name":"pixel_values","datatype":"FP32","shape":[1,3,8,8],"data":'
            + data + '}]}').encode()
    with pytest.raises(Failure, match=message) as e:
        parse_infer_request(body, None, model, max_batch=4)
    assert e.value.status == 400


def test_json_parsing_memory_is_bounded_by_the_body_not_by_python_floats(tiny_bundle):
    with ViTSession(tiny_bundle[1].path) as session:
        model = serving_model(session)
    shape = (4, 3, 256, 256)  # 786,432 values of "0," : 1.5 MB of text
    body = ('{"inputs":[{"name":"pixel_values","datatype":"FP32","shape":'
            + json.dumps(list(shape)) + ',"data":[' + ",".join(["0"] * math.prod(shape))
            + ']}]}').encode()
    tracemalloc.start()
    try:
        got = parse_infer_request(body, None, model, max_batch=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.inputs["pixel_values"].shape == shape
    assert peak < 2 * len(body) + 4 * math.prod(shape)  # json.loads alone: ~8 B per value
    # What numpy cannot take stays JSON, under its own limit (a 413 before parsing it).
    limits = Limits(max_json_bytes=1024 * 1024)
    nan_at_end = body.replace(b",0]}]}", b",NaN]}]}")
    with pytest.raises(Failure, match="besides its arrays of plain numbers") as e:
        parse_infer_request(nan_at_end, None, model, max_batch=4, limits=limits)
    assert e.value.status == 413


@pytest.mark.parametrize("shape", [[4, 3, 4096, 4096], [1, 3, 10 ** 6, 10 ** 6],
                                   [4, 3, 2048, 2048]])
def test_a_declared_shape_over_the_limit_is_413_before_its_data_is_read(tiny_bundle, shape):
    with ViTSession(tiny_bundle[1].path) as session:
        model = serving_model(session)
    body = json.dumps({"inputs": [{"name": "pixel_values", "datatype": "FP32",
                                   "shape": shape, "data": [1, 2, 3]}]}).encode()
    with pytest.raises(Failure, match="over the limit") as e:
        parse_infer_request(body, None, model, max_batch=4)
    assert e.value.status == 413 and str(shape[2]) in e.value.message
