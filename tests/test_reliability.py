"""Crashes, interruptions, hostile files, load: what vit-deploy guarantees."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from conftest import tiny
from vit_deploy.cli import main
from vit_deploy.contract import MANIFEST_NAME, MODEL_FILE
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.parity import sample_inputs
from vit_deploy.runtime import BundleError, InputError, ViTSession
from dataclasses import asdict

from vit_deploy.runtime.manifest import FileEntry


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
@pytest.mark.parametrize("previous", [False, True], ids=["fresh", "over-previous"])
def test_sigkill_during_export_leaves_nothing_partial(tmp_path, previous):
    out = tmp_path / "bundle"
    if previous:
        export_bundle(tiny(), out, options=ExportOptions(simplify=False))
        before = (out / MANIFEST_NAME).read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "export", "--model", "S",
                             "--patch", "16", "--out", str(out), "--force"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    try:  # wait until the export is writing into its temporary directory, then kill it
        while time.time() < deadline and proc.poll() is None:
            tmps = list(tmp_path.glob(".bundle.tmp-*"))
            if tmps and any(tmps[0].iterdir()):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the export ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    if previous:
        assert (out / MANIFEST_NAME).read_bytes() == before
        with ViTSession(out) as s:  # still a complete, verifiable bundle
            assert s.run(sample_inputs((8, 8), 1)).shape == (1, 10)
    else:
        assert not out.exists()


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_disk_full_or_read_only_gives_a_clear_error_and_no_files(tmp_path, monkeypatch, error):
    import vit_deploy.atomic as atomic

    real = atomic.write_bytes_atomic

    def failing(dst, data):
        raise OSError(error, os.strerror(error), str(dst))

    monkeypatch.setattr("vit_deploy.export.onnx.write_bytes_atomic", failing)
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", "--model", "tiny", "--out", str(out)])
    assert r.exit_code == 1 and os.strerror(error) in r.output and "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []
    assert real  # untouched


def test_read_only_directory_for_the_output(tmp_path, monkeypatch):
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(errno.EROFS, "Read-only file system", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    r = CliRunner().invoke(main, ["export", "--model", "tiny", "--out", str(tmp_path / "b")])
    assert r.exit_code == 1 and "Read-only file system" in r.output
    assert not (tmp_path / "b").exists()


def _external_model(dir_: Path, location: str) -> Path:
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    weight.data_location = TensorProto.EXTERNAL
    weight.ClearField("float_data")
    weight.ClearField("raw_data")
    weight.external_data.add(key="location", value=location)
    weight.external_data.add(key="offset", value="0")
    weight.external_data.add(key="length", value="64")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    path = dir_ / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_external_data_outside_the_bundle_is_refused(tmp_path):
    inner = tmp_path / "bundle"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.ones(16, np.float32).tobytes())
    path = _external_model(inner, "../secret.bin")
    with pytest.raises(BundleError, match="outside the model's directory"):
        ViTSession(path)


def test_external_data_not_in_the_manifest_is_refused(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(result.path, bundle)
    (bundle / "data.bin").write_bytes(np.ones(16, np.float32).tobytes())
    model_path = _external_model(bundle, "data.bin")  # replaces model.onnx
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    manifest["files"][MODEL_FILE] = asdict(FileEntry.of(model_path, "model:fp32"))
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="not listed"):
        ViTSession(bundle)


@pytest.mark.parametrize("damage,match", [
    (lambda m: m.pop("files"), "misses keys"),
    (lambda m: m.update(files=[]), "files must be an object"),
    (lambda m: m["files"]["model.onnx"].update(sha256="abc"), "64 hex"),
    (lambda m: m["models"].update(fp32="other.onnx"), "listed under files"),
    (lambda m: m["config"].update(patch_size=0), "config.patch_size"),
    (lambda m: m["preprocess"].update(resolution=[224]), "preprocess.resolution"),
    (lambda m: m.update(labels=["a"]), "labels"),
    (lambda m: m.update(format_version=99), "up to v2"),
])
def test_manifest_with_missing_or_wrong_fields_is_refused(tiny_bundle, tmp_path, damage, match):
    _, result = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(result.path, bundle)
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    damage(manifest)
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=match):
        ViTSession(bundle)
    r = CliRunner().invoke(main, ["predict", str(bundle), str(bundle / MANIFEST_NAME)])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_attention_that_cannot_fit_is_refused_with_the_estimate(tiny_bundle):
    _, result = tiny_bundle
    with ViTSession(result.path) as s, pytest.raises(InputError, match=r"GiB are available"):
        s.validate_input(np.zeros((1, 3, 8 * 300, 8 * 300), np.float32))
    r = CliRunner().invoke(main, ["export", "--model", "B", "--res", "8192"])
    assert r.exit_code == 2 and "attention needs about" in r.output


@pytest.mark.slow
def test_one_session_8_threads_1000_runs(tiny_bundle):
    _, result = tiny_bundle
    inputs = [sample_inputs((8 * (1 + i % 4), 8 * (1 + i % 3)), 1 + i % 2, seed=i) for i in range(25)]
    with ViTSession(result.path) as s:
        expected = [s.run(x) for x in inputs]
        with ThreadPoolExecutor(8) as pool:
            # warm up: ORT's arena at every shape, and each thread's malloc arena
            list(pool.map(lambda i: s.run(inputs[i % 25]), range(1000)))
            rss0 = _rss_mb()
            outs = list(pool.map(lambda i: (i % 25, s.run(inputs[i % 25])), range(1000)))
            rss1 = _rss_mb()
    assert len(outs) == 1000
    for k, out in outs:
        np.testing.assert_array_equal(out, expected[k])
    assert rss1 < rss0 * 1.05, (rss0, rss1)


@pytest.mark.slow
def test_200_sessions_created_and_closed_do_not_leak(tiny_bundle):
    _, result = tiny_bundle
    x = sample_inputs((16, 16), 1)
    for _ in range(20):  # steady state first
        with ViTSession(result.path) as s:
            s.run(x)
    rss0, fds0 = _rss_mb(), _fds()
    for _ in range(200):
        with ViTSession(result.path) as s:
            s.run(x)
    rss1, fds1 = _rss_mb(), _fds()
    assert fds1 - fds0 <= 3, (fds0, fds1)
    assert rss1 - rss0 < 25, (rss0, rss1)  # MB
    assert threading.active_count() < 50
