"""Triton repository (validated with Triton's own protobuf) and the HTTP server."""

import io
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from PIL import Image
from tritonclient.grpc import model_config_pb2

from vit_deploy.cli import main
from vit_deploy.precisions import add_precisions


def _parse(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_triton_repository_parses_with_tritons_protobuf(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    repo = tmp_path / "repo"
    r = CliRunner().invoke(main, ["triton", str(result.path), "--out", str(repo), "--name", "vit",
                                  "--max-batch", "16", "--instances", "cpu:2,gpu:1",
                                  "--dynamic-batching-us", "500", "--accelerator", "tensorrt-fp16"])
    assert r.exit_code == 0, r.output
    config = _parse(repo / "vit" / "config.pbtxt")
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 16
    assert config.input[0].name == "pixel_values" and list(config.input[0].dims) == [3, -1, -1]
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    assert config.output[0].name == "logits" and list(config.output[0].dims) == [10]
    assert [(g.kind, g.count) for g in config.instance_group] == [
        (model_config_pb2.ModelInstanceGroup.KIND_CPU, 2),
        (model_config_pb2.ModelInstanceGroup.KIND_GPU, 1)]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    accel = config.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accel.name == "tensorrt" and accel.parameters["precision_mode"] == "FP16"
    assert (repo / "vit" / "1" / "model.onnx").read_bytes() == (result.path / "model.onnx").read_bytes()


def test_triton_turns_dynamic_batching_off_for_batch_coupled_int8(tiny_bundle, tmp_path):
    import shutil

    _, result = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(result.path, bundle)
    add_precisions(bundle, ["int8"])
    r = CliRunner().invoke(main, ["triton", str(bundle), "--out", str(tmp_path / "repo"),
                                  "--precision", "int8"])
    assert r.exit_code == 0 and "dynamic batching" in r.output
    assert not _parse(tmp_path / "repo" / "b" / "config.pbtxt").HasField("dynamic_batching")


@pytest.mark.parametrize("args,message", [(["--instances", "tpu:1"], "instances must look like"),
                                          (["--precision", "int4"], "no 'int4' model")])
def test_triton_bad_arguments(tiny_bundle, tmp_path, args, message):
    _, result = tiny_bundle
    r = CliRunner().invoke(main, ["triton", str(result.path), "--out", str(tmp_path / "r"), *args])
    assert r.exit_code == 2 and message in r.output and not (tmp_path / "r").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _png(value: int, size=(40, 50)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((*size, 3), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(tiny_bundle):
    _, result = tiny_bundle
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "serve", str(result.path),
                             "--port", str(port), "--max-batch", "8", "--max-wait-ms", "100",
                             "--top-k", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError(proc.stderr.read().decode())
    yield url, result.path
    proc.terminate()
    proc.wait(timeout=10)


def test_predict_health_metadata(server):
    url, bundle = server
    r = httpx.post(f"{url}/predict", content=_png(90), headers={"content-type": "image/png"})
    assert r.status_code == 200
    body = r.json()
    assert len(body["top"]) == 3 and body["provider"] == "CPUExecutionProvider"
    from vit_deploy.runtime import ViTSession

    with ViTSession(bundle) as s:  # the server answers what the runtime answers
        expected = s.predict(_png(90), top_k=3)[0]
    assert [t["index"] for t in body["top"]] == [c.index for c in expected.top]
    r = httpx.post(f"{url}/predict", files={"file": ("a.png", _png(90), "image/png")})
    assert r.status_code == 200 and r.json()["top"] == body["top"]
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
    assert httpx.get(f"{url}/metadata").json()["config"]["name"] == "tiny/8"


def test_concurrent_requests_are_batched(server):
    url, _ = server
    before = httpx.get(f"{url}/metrics").json()
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: httpx.post(
            f"{url}/predict", content=_png(i * 20), headers={"content-type": "image/png"},
            timeout=30), range(8)))
    assert all(r.status_code == 200 for r in responses)
    after = httpx.get(f"{url}/metrics").json()
    assert after["requests"] - before["requests"] == 8
    assert after["batches"] - before["batches"] < 8  # some requests shared a batch
    assert max(r.json()["batch_size"] for r in responses) > 1


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
