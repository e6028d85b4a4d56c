"""`vit-deploy serve` speaks the Open Inference Protocol (KServe v2 REST), proven with a client
no one here wrote: Triton's own `tritonclient.http`, against the real command on a port the
OS picks. Outputs are compared with the runtime called directly; the metadata with the
config.pbtxt that `vit-deploy triton` writes (one source for both)."""

import gzip
import io
import json
import re
import subprocess
import sys
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as oip
from click.testing import CliRunner
from fastapi.testclient import TestClient
from google.protobuf import text_format
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from vit_deploy.cli import main
from vit_deploy.runtime.contract import FEATURES_NAME, INDEPENDENCE_ABS_TOL, INPUT_NAME, LOGITS_NAME
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.session import InputError
from vit_deploy.serve.app import make_app
from vit_deploy.triton import model_metadata, triton_repository

ROOT = Path(__file__).resolve().parents[2]
NAME = "vit_tiny"
MAX_BATCH = 4
LABELS = tuple(f"digit-{i}" for i in range(10))
EXACT = 1e-6  # the server runs the same session on the same batch: equal up to float noise


# -- fixtures: a two-output bundle, the real server, the runtime as the reference ----------


@pytest.fixture(scope="module")
def bundle(make_tiny, tmp_path_factory) -> Path:
    """A tiny bundle with two outputs (logits, pooled) and labels, dynamic H, W."""
    out = tmp_path_factory.mktemp("v2") / "tiny-two-outputs"
    export_bundle(make_tiny(), out, options=ExportOptions(resolution=(48, 64), features=True,
                                                          labels=LABELS))
    return out


@contextmanager
def serving(bundle: Path, *args: str):
    """`vit-deploy serve` in a subprocess; yields its URL once it listens (it prints it)."""
    proc = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "serve", str(bundle),
                             "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        found = re.search(r" on (http://\S+)", line)
        if not found:
            proc.kill()
            raise RuntimeError(f"serve did not start: {line!r} {proc.stderr.read()}")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def url(bundle):
    with serving(bundle, "--name", NAME, "--max-batch", str(MAX_BATCH),
                 "--max-wait-ms", "50") as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    c = oip.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def runtime(bundle):
    with ViTSession(bundle) as s:
        yield s


def _pixels(batch: int, hw=(48, 64), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, *hw)).astype(np.float32)


def _input(x: np.ndarray, binary: bool = True, name: str = INPUT_NAME,
           datatype: str = "FP32") -> oip.InferInput:
    inp = oip.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


def _serves(client, runtime) -> None:
    """The server still answers a good request, with the runtime's numbers."""
    x = _pixels(1, seed=99)
    got = client.infer(NAME, [_input(x)]).as_numpy(LOGITS_NAME)
    np.testing.assert_allclose(got, runtime.run_all(x)[LOGITS_NAME], rtol=0, atol=EXACT)


# -- health and metadata -------------------------------------------------------------------


def test_health_and_metadata_through_tritonclient(client, bundle, tmp_path):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(NAME) and client.is_model_ready(NAME, "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready(NAME, "2")
    server = client.get_server_metadata()
    assert server["name"] == "vit-deploy" and "binary_tensor_data" in server["extensions"]

    meta = client.get_model_metadata(NAME)
    assert meta == client.get_model_metadata(NAME, "1")
    assert meta == {"name": NAME, "versions": ["1"], "platform": "onnxruntime_onnx",
                    "inputs": [{"name": INPUT_NAME, "datatype": "FP32",
                                "shape": [-1, 3, -1, -1]}],
                    "outputs": [{"name": LOGITS_NAME, "datatype": "FP32", "shape": [-1, 10]},
                                {"name": FEATURES_NAME, "datatype": "FP32", "shape": [-1, 48]}]}

    # One source: what Triton would load from `vit-deploy triton` says the same.
    repo, name, _ = triton_repository(bundle, tmp_path / "repo", name=NAME)
    config = text_format.Parse((repo / name / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert (config.name, config.platform) == (meta["name"], meta["platform"])
    for kind, tensors in (("inputs", config.input), ("outputs", config.output)):
        assert [(t.name, model_config_pb2.DataType.Name(t.data_type), [-1, *t.dims])
                for t in tensors] == [(t["name"], "TYPE_" + t["datatype"], t["shape"])
                                      for t in meta[kind]]


def test_unknown_model_and_version_are_404_with_a_v2_error(client, url):
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope")
    assert e.value.status() == "404" and "unknown model 'nope'" in e.value.message()
    r = httpx.get(f"{url}/v2/models/{NAME}/versions/7")
    assert r.status_code == 404 and set(r.json()) == {"error"} and "no version '7'" in r.text
    r = httpx.get(f"{url}/v2/no/such/path")
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = httpx.get(f"{url}/v2/health/live")
    assert r.status_code == 200 and r.json() == {"live": True}


# -- inference: the runtime's numbers, in every encoding -----------------------------------


@pytest.mark.parametrize("binary_in", [True, False], ids=["in-binary", "in-json"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["out-binary", "out-json"])
@pytest.mark.parametrize("batch,hw", [(1, (48, 64)), (3, (32, 40))])
def test_infer_matches_the_runtime(client, runtime, binary_in, binary_out, batch, hw):
    x = _pixels(batch, hw, seed=batch)
    expected = runtime.run_all(x)
    outputs = [oip.InferRequestedOutput(n, binary_data=binary_out)
               for n in (LOGITS_NAME, FEATURES_NAME)]
    result = client.infer(NAME, [_input(x, binary_in)], outputs=outputs, request_id="req-1")
    response = result.get_response()
    assert response["model_name"] == NAME and response["model_version"] == "1"
    assert response["id"] == "req-1"
    for name in (LOGITS_NAME, FEATURES_NAME):
        got = result.as_numpy(name)
        assert got.dtype == np.float32 and got.shape == expected[name].shape
        np.testing.assert_allclose(got, expected[name], rtol=0, atol=EXACT)


def test_outputs_default_to_all_in_binary_and_can_be_a_subset(client, runtime):
    x = _pixels(2, seed=5)
    expected = runtime.run_all(x)
    result = client.infer(NAME, [_input(x)])  # no outputs named: all, binary
    assert [o["name"] for o in result.get_response()["outputs"]] == [LOGITS_NAME, FEATURES_NAME]
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
    result = client.infer(NAME, [_input(x)], model_version="1",
                          outputs=[oip.InferRequestedOutput(FEATURES_NAME, binary_data=False)])
    assert [o["name"] for o in result.get_response()["outputs"]] == [FEATURES_NAME]
    assert result.as_numpy(LOGITS_NAME) is None
    np.testing.assert_allclose(result.as_numpy(FEATURES_NAME), expected[FEATURES_NAME],
                               rtol=0, atol=EXACT)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client, runtime, algorithm):
    x = _pixels(1, seed=7)
    result = client.infer(NAME, [_input(x)], request_compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy(LOGITS_NAME), runtime.run_all(x)[LOGITS_NAME],
                               rtol=0, atol=EXACT)


def test_plain_json_over_http(url, runtime):
    """No client library: the JSON a curl user would send (nested data) and get back."""
    x = _pixels(1, seed=11)
    body = {"inputs": [{"name": INPUT_NAME, "shape": list(x.shape), "datatype": "FP32",
                        "data": x.tolist()}], "outputs": [{"name": LOGITS_NAME}]}
    r = httpx.post(f"{url}/v2/models/{NAME}/infer", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = r.json()["outputs"]
    assert [(o["name"], o["datatype"], o["shape"]) for o in out] == [(LOGITS_NAME, "FP32", [1, 10])]
    np.testing.assert_allclose(np.array(out[0]["data"], np.float32).reshape(1, 10),
                               runtime.run_all(x)[LOGITS_NAME], rtol=0, atol=EXACT)


def _stats(url) -> dict:
    return httpx.get(f"{url}/stats").json()


def test_concurrent_v2_and_predict_requests_share_the_batcher(url, runtime):
    before = _stats(url)
    xs = [_pixels(1, seed=100 + i) for i in range(8)]
    images = []
    for i in range(4):
        buf = io.BytesIO()
        Image.fromarray(np.full((40, 50, 3), 30 * i, np.uint8)).save(buf, format="PNG")
        images.append(buf.getvalue())

    def v2(x):
        c = oip.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
        try:
            return c.infer(NAME, [_input(x)]).as_numpy(LOGITS_NAME)
        finally:
            c.close()

    def predict(image):
        return httpx.post(f"{url}/predict", content=image,
                          headers={"content-type": "image/png"}, timeout=120)

    with ThreadPoolExecutor(12) as pool:
        v2_results = [pool.submit(v2, x) for x in xs]
        predicted = [pool.submit(predict, image) for image in images]
        v2_results = [f.result() for f in v2_results]
        predicted = [f.result() for f in predicted]
    for x, got in zip(xs, v2_results):  # batch-mates move a row only by float noise
        np.testing.assert_allclose(got, runtime.run_all(x)[LOGITS_NAME], rtol=0,
                                   atol=INDEPENDENCE_ABS_TOL)
    for image, r in zip(images, predicted):
        assert r.status_code == 200
        assert [t["index"] for t in r.json()["top"]] == \
            [c.index for c in runtime.predict(image)[0].top]
    after = _stats(url)
    assert after["responses"]["v2"]["200"] - before["responses"]["v2"].get("200", 0) == 8
    assert after["requests"] - before["requests"] == 12
    assert after["images"] - before["images"] == 12
    assert after["batches"] - before["batches"] < 12  # some requests shared a session run
    assert after["max_batch_seen"] <= MAX_BATCH


# -- bad requests: the right 4xx, a v2 error body, and the server lives on -----------------


TRITONCLIENT_ERRORS = {
    "four channels": (lambda: [_input(_pixels(1)[:, :1].repeat(4, axis=1))], None, "shape"),
    "FP64": (lambda: [_input(_pixels(1).astype(np.float64), datatype="FP64")], None,
             "datatype 'FP64'"),
    "INT32": (lambda: [_input(np.zeros((1, 3, 48, 64), np.int32), datatype="INT32")], None,
              "the model takes FP32"),
    "over max batch": (lambda: [_input(_pixels(MAX_BATCH + 1))], None, "batch of 5"),
    "not a patch multiple": (lambda: [_input(_pixels(1, (48, 60)))], None, "multiple"),
    "unknown input": (lambda: [_input(_pixels(1), name="image")], None, "unknown input 'image'"),
    "unknown output": (lambda: [_input(_pixels(1))], [oip.InferRequestedOutput("probs")],
                       "unknown output 'probs'"),
    "classification": (lambda: [_input(_pixels(1))],
                       [oip.InferRequestedOutput(LOGITS_NAME, class_count=3)],
                       "classification extension is not supported"),
}


@pytest.mark.parametrize("case", list(TRITONCLIENT_ERRORS))
def test_bad_requests_through_tritonclient(client, runtime, case):
    inputs, outputs, message = TRITONCLIENT_ERRORS[case]
    with pytest.raises(InferenceServerException) as e:
        client.infer(NAME, inputs(), outputs=outputs)
    assert e.value.status() == "400" and message in e.value.message(), e.value.message()
    _serves(client, runtime)


def test_an_unknown_model_is_404_through_tritonclient(client, runtime):
    with pytest.raises(InferenceServerException) as e:
        client.infer("nope", [_input(_pixels(1))])
    assert e.value.status() == "404" and "serves 'vit_tiny'" in e.value.message()
    _serves(client, runtime)


def _good_body(binary: bool = True) -> tuple[bytes, int | None]:
    """A valid request body (tritonclient's own encoder) and its JSON header length."""
    return oip.InferenceServerClient.generate_request_body([_input(_pixels(1), binary)])


def _json(doc) -> bytes:
    return json.dumps(doc).encode()


def _inp(**fields) -> dict:
    return {"name": INPUT_NAME, "shape": [1, 3, 8, 8], "datatype": "FP32"} | fields


def _raw_cases():
    body, n = _good_body()
    tail = b"\0" * 16
    yield "malformed JSON", b'{"inputs": [', {}, 400, "not valid JSON"
    yield "JSON not an object", b"[1, 2]", {}, 400, "must be a JSON object"
    yield "not UTF-8", b'{"inputs": "\xff"}', {}, 400, "not valid JSON"
    yield "header length not a number", body, {"Inference-Header-Content-Length": "12x"}, 400, \
        "must be a number"
    yield "header length past the body", body, \
        {"Inference-Header-Content-Length": str(len(body) + 1)}, 400, "the body has only"
    yield "header length cuts the JSON", body, \
        {"Inference-Header-Content-Length": str(n - 5)}, 400, "not valid JSON"
    yield "binary data missing", body[:n], {"Inference-Header-Content-Length": str(n)}, 400, \
        "only 0 bytes follow"
    yield "binary data left over", body + tail, {"Inference-Header-Content-Length": str(n)}, \
        400, "16 bytes after the JSON header belong to no input"
    header = _json({"inputs": [_inp(parameters={"binary_data_size": 16})]})
    yield "binary_data_size wrong", header + tail, \
        {"Inference-Header-Content-Length": str(len(header))}, 400, "needs 768 bytes"
    yield "binary data without the header length", header + tail, {}, 400, "not valid JSON"
    yield "data not numbers", _json({"inputs": [_inp(data=["a"] * 192)]}), {}, 400, \
        "only numbers"
    yield "data booleans", _json({"inputs": [_inp(data=[True] * 192)]}), {}, 400, "got a boolean"
    yield "data ragged", _json({"inputs": [_inp(data=[[1.0, 2.0], [3.0]])]}), {}, 400, "ragged"
    yield "data too short", _json({"inputs": [_inp(data=[0.5] * 191)]}), {}, 400, \
        "holds 191 values"
    yield "data not a list", _json({"inputs": [_inp(data="x")]}), {}, 400, "JSON array"
    yield "no data", _json({"inputs": [_inp()]}), {}, 400, "neither data nor"
    yield "no inputs", _json({"outputs": []}), {}, 400, "inputs must be a JSON array"
    yield "input twice", _json({"inputs": [_inp(data=[0.0] * 192)] * 2}), {}, 400, "twice"
    yield "shape not ints", _json({"inputs": [_inp(shape=[1, 3, "8", 8], data=[0.0] * 192)]}), \
        {}, 400, "has shape"
    yield "shape negative", _json({"inputs": [_inp(shape=[1, 3, -8, 8], data=[0.0] * 192)]}), \
        {}, 400, "has shape"
    yield "empty batch", _json({"inputs": [_inp(shape=[0, 3, 8, 8], data=[])]}), {}, 400, \
        "batch of 0"
    yield "id not a string", _json({"id": 3, "inputs": [_inp(data=[0.0] * 192)]}), {}, 400, \
        "id must be a string"
    yield "output binary_data not a bool", _json({"inputs": [_inp(data=[0.0] * 192)], "outputs": [
        {"name": LOGITS_NAME, "parameters": {"binary_data": "yes"}}]}), {}, 400, "true or false"
    yield "shared memory", _json({"inputs": [_inp(parameters={
        "shared_memory_region": "r"})]}), {}, 400, "shared memory"
    yield "unknown encoding", body, {"Content-Encoding": "br"}, 415, "content-encoding"
    yield "broken gzip", b"\x1f\x8b not gzip", {"Content-Encoding": "gzip"}, 400, \
        "not valid gzip"
    yield "truncated deflate", zlib.compress(body)[:-8], {"Content-Encoding": "deflate"}, 400, \
        "truncated"


RAW = {case[0]: case[1:] for case in _raw_cases()}


@pytest.mark.parametrize("case", list(RAW))
def test_bad_requests_get_a_v2_error_and_the_server_lives_on(url, client, runtime, case):
    body, headers, status, message = RAW[case]
    r = httpx.post(f"{url}/v2/models/{NAME}/infer", content=body, headers=headers, timeout=60)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and message in r.json()["error"], r.json()
    _serves(client, runtime)


def test_a_gzipped_body_is_counted_after_inflating(session_app):
    client, _ = session_app(max_infer_bytes=4096)
    zeros = np.zeros((1, 3, 48, 64), np.float32)  # 36 KB, gzipped to a few hundred bytes
    body, n = oip.InferenceServerClient.generate_request_body([_input(zeros)])
    r = client.post(f"/v2/models/{NAME}/infer", content=gzip.compress(body),
                    headers={"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(n)})
    assert r.status_code == 413 and "inflates to over the limit" in r.json()["error"]
    r = client.post(f"/v2/models/{NAME}/infer", content=body,
                    headers={"Inference-Header-Content-Length": str(n)})
    assert r.status_code == 413 and "over the limit of 4096" in r.json()["error"]


# -- in process: a full queue, metrics -----------------------------------------------------


@pytest.fixture
def session_app(bundle):
    """session_app(**make_app kwargs) -> (TestClient, Batcher), lifespan running."""
    with ViTSession(bundle) as session, ExitStack() as stack:
        def start(**kwargs):
            app = make_app(session, model_name=NAME, **kwargs)
            return stack.enter_context(TestClient(app)), app.state.batcher

        yield start


def test_a_full_queue_answers_v2_with_503_and_retry_after(session_app, monkeypatch):
    client, batcher = session_app(max_batch=1, max_wait_ms=0, max_queue=1)
    entered, release = threading.Event(), threading.Event()
    real = batcher.session.run_all

    def run_all(x):
        entered.set()
        release.wait()
        return real(x)

    monkeypatch.setattr(batcher.session, "run_all", run_all)
    body, n = _good_body()
    headers = {"Inference-Header-Content-Length": str(n)}

    def post():
        return client.post(f"/v2/models/{NAME}/infer", content=body, headers=headers)

    queued = threading.Semaphore(0)
    real_put = batcher.queue.put_nowait

    def put_nowait(job):
        real_put(job)
        queued.release()

    monkeypatch.setattr(batcher.queue, "put_nowait", put_nowait)
    with ThreadPoolExecutor(2) as pool:
        try:
            running = pool.submit(post)
            assert entered.wait(120), "the worker never started the first request"
            assert queued.acquire(timeout=120)
            waiting = pool.submit(post)
            assert queued.acquire(timeout=120), "the second request was never queued"
            r = post()
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert set(r.json()) == {"error"} and "busy" in r.json()["error"]
            families = _families(client.get("/metrics").text)
            assert _value(families, "vit_deploy_queue_depth") == 1
            assert _value(families, "vit_deploy_queue_capacity") == 1
        finally:
            release.set()
        assert [running.result().status_code, waiting.result().status_code] == [200, 200]


def test_a_failed_session_run_is_500_for_that_request_only(session_app, monkeypatch):
    client, batcher = session_app(max_wait_ms=0)
    real, calls = batcher.session.run_all, []

    def run_all(x):
        calls.append(len(x))
        if len(calls) == 1:
            raise RuntimeError("onnxruntime: out of memory")
        return real(x)

    monkeypatch.setattr(batcher.session, "run_all", run_all)
    body, n = _good_body()
    headers = {"Inference-Header-Content-Length": str(n)}
    r = client.post(f"/v2/models/{NAME}/infer", content=body, headers=headers)
    assert r.status_code == 500
    assert r.json() == {"error": "inference failed: RuntimeError: onnxruntime: out of memory"}
    r = client.post(f"/v2/models/{NAME}/infer", content=body, headers=headers)
    assert r.status_code == 200 and int(r.headers["inference-header-content-length"]) < len(r.content)


def test_requests_merged_past_the_memory_guard_run_one_image_at_a_time(session_app,
                                                                         monkeypatch):
    """Each request passed the guard alone; their merged batch must not cost them a 500."""
    client, batcher = session_app(max_batch=2, max_wait_ms=600_000)  # a batch needs both
    real, calls = batcher.session.run_all, []

    def run_all(x):
        calls.append(len(x))
        if len(x) > 1:
            raise InputError("attention needs about 99 GiB (batch 2)")
        return real(x)

    monkeypatch.setattr(batcher.session, "run_all", run_all)
    body, n = _good_body()
    headers = {"Inference-Header-Content-Length": str(n)}
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: client.post(
            f"/v2/models/{NAME}/infer", content=body, headers=headers), range(2)))
    assert [r.status_code for r in answers] == [200, 200] and calls == [2, 1, 1]


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict, name: str, suffix: str = "", **labels) -> float:
    return sum(s.value for s in families[name].samples
               if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_are_prometheus_text(url, client, runtime):
    before = _families(httpx.get(f"{url}/metrics").text)
    for batch in (1, 2):
        client.infer(NAME, [_input(_pixels(batch))])
    with pytest.raises(InferenceServerException):
        client.infer(NAME, [_input(_pixels(1, (48, 60)))])
    r = httpx.post(f"{url}/predict", content=b"not an image", headers={"content-type": "image/png"})
    assert r.status_code == 400
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    after = _families(r.text)
    assert {"vit_deploy_requests", "vit_deploy_request_duration_seconds", "vit_deploy_batch_size",
            "vit_deploy_queue_depth", "vit_deploy_queue_capacity", "vit_deploy_worker_up",
            "vit_deploy_worker_errors", "vit_deploy_max_batch"} <= set(after)
    assert after["vit_deploy_requests"].type == "counter"
    assert after["vit_deploy_request_duration_seconds"].type == "histogram"

    def delta(name, suffix="", **labels):
        return _value(after, name, suffix, **labels) - _value(before, name, suffix, **labels)

    assert delta("vit_deploy_requests", "_total", endpoint="v2", code="200") == 2
    assert delta("vit_deploy_requests", "_total", endpoint="v2", code="400") == 1
    assert delta("vit_deploy_requests", "_total", endpoint="predict", code="400") == 1
    assert delta("vit_deploy_request_duration_seconds", "_count", endpoint="v2") == 2
    assert delta("vit_deploy_request_duration_seconds", "_bucket", endpoint="v2", le="+Inf") == 2
    assert delta("vit_deploy_batch_size", "_count") == 2
    assert delta("vit_deploy_batch_size", "_sum") == 3
    assert delta("vit_deploy_batch_size", "_bucket", le="1") == 1
    assert _value(after, "vit_deploy_worker_up") == 1
    assert _value(after, "vit_deploy_max_batch") == MAX_BATCH
    assert _value(after, "vit_deploy_queue_depth") == 0


# -- the example client and the deployment files -------------------------------------------


def test_the_example_client_classifies_against_serve(url, bundle, runtime, tmp_path):
    images = []
    for i, size in enumerate([(40, 50), (64, 48)]):
        images.append(tmp_path / f"img{i}.png")
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (*size, 3), np.uint8)).save(
            images[-1])
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "oip_client.py"), "--url", url,
                        "--model", NAME, "--bundle", str(bundle), "--top-k", "3",
                        *map(str, images)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(images)
    for line, image in zip(lines, images):
        prediction = runtime.predict(image, top_k=3)[0]  # one image per request, as the example
        assert line == f"{image}: " + ", ".join(f"{c.label}: {c.probability:.4f}"
                                                for c in prediction.top)


def test_the_example_client_embeds_and_refuses_to_call_vectors_classes(url, bundle, runtime,
                                                                       tmp_path):
    image = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (40, 50, 3), np.uint8)).save(image)
    client = [sys.executable, str(ROOT / "examples" / "oip_client.py"), "--url", url,
              "--model", NAME, "--bundle", str(bundle)]
    r = subprocess.run([*client, "--embed", str(image)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    v = runtime.embed(image)[0]
    assert r.stdout.strip() == (f"{image}: pooled dim {len(v)}, unit length: "
                                + " ".join(f"{x:.4f}" for x in v[:8]) + " ..."), r.stdout
    r = subprocess.run([*client, "--output", "pooled", str(image)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "no classifier's output" in r.stderr, r.stderr


def test_the_example_client_says_what_is_wrong(url, bundle, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "oip_client.py"), "--url", url,
                        "--model", "nope", "--bundle", str(bundle), "x.png"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "'nope' is not ready" in r.stderr


def test_kserve_manifest_points_kserve_at_a_triton_repository():
    yaml = pytest.importorskip("yaml")
    service = yaml.safe_load((ROOT / "examples" / "kserve-inferenceservice.yaml").read_text())
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["kind"] == "InferenceService"
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "triton" and model["protocolVersion"] == "v2"
    assert model["runtime"] == "kserve-tritonserver" and model["storageUri"]


def test_serve_checks_the_model_name_as_triton_does(bundle):
    r = CliRunner().invoke(main, ["serve", str(bundle), "--name", "a/b", "--port", "0"])
    assert r.exit_code == 2 and "Triton model name must be" in r.output


def test_model_metadata_lists_every_output_of_the_manifest(bundle):
    """Outputs beyond logits / pooled (dense ones, layer_N) take symbolic dims as -1."""
    import dataclasses

    from vit_deploy.runtime.manifest import load_manifest
    from vit_deploy.runtime.manifest_parts import TensorSpec

    manifest = load_manifest(bundle)
    extra = TensorSpec("patch_tokens", "float32", ("batch", 48, "grid_height", "grid_width"))
    manifest = dataclasses.replace(manifest, io=dataclasses.replace(
        manifest.io, outputs=(*manifest.io.outputs, extra)))
    meta = model_metadata(manifest, NAME).to_dict()
    assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [
        (LOGITS_NAME, [-1, 10]), (FEATURES_NAME, [-1, 48]), ("patch_tokens", [-1, 48, -1, -1])]
