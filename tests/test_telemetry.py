"""Nothing sent: ONNX Runtime's telemetry is off in every entry point before it loads.

ONNX Runtime's official wheels keep an event store (~/.cache/Microsoft/DeveloperTools/
.onnxruntime/onnxruntime.db, with a device id) from the moment the library loads, and upload
it when a network is there; CI variables (CI, TF_BUILD, GITHUB_ACTIONS, GITLAB_CI) suppress
it, so every run here unsets them, gives the process a fresh HOME and records its connect()
calls with strace. The control (ONNX Runtime alone) proves the store would be seen.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vit_deploy import ORT_TELEMETRY_OPT_IN
from vit_deploy.export.bundle import ExportOptions, export_bundle

ROOT = Path(__file__).resolve().parents[1]
STORE = Path(".cache", "Microsoft", "DeveloperTools", ".onnxruntime")
SUPPRESSORS = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "ORT_DISABLE_TELEMETRY",
               ORT_TELEMETRY_OPT_IN)
PHOTO = ROOT / "vit_deploy" / "data" / "photos" / "eval-chelsea.jpg"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, make_tiny):
    out = tmp_path_factory.mktemp("telemetry") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(resolution=(32, 32), simplify=False))
    return out


def _run(tmp_path: Path, argv: list[str], **extra: str) -> tuple[list[str], list[str]]:
    """Run `argv` as a user would (no CI variables, a fresh HOME); what it left in the event
    store's folder and the network connect() calls it made."""
    home = tmp_path / "home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in SUPPRESSORS} | {"HOME": str(home)}
    trace = tmp_path / "connect.txt"
    strace = shutil.which("strace")
    assert strace, "strace is missing: `make test` installs it (Makefile, SYSTEM_STAMP)"
    r = subprocess.run([strace, "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *argv],
                       env=env | extra, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    store = home / STORE
    left = sorted(p.name for p in store.iterdir()) if store.exists() else []
    calls = [line for line in trace.read_text().splitlines()
             if re.search(r"AF_INET6?\b", line)]
    return left, calls


SESSION = ("import numpy as np, onnxruntime as ort; "
           "s = ort.InferenceSession({model!r}, providers=['CPUExecutionProvider']); "
           "s.run(None, {{'pixel_values': np.zeros((1, 3, 32, 32), np.float32)}})")


def test_the_control_onnx_runtime_alone_keeps_an_event_store(tmp_path, bundle):
    """Without vit-deploy, the same session leaves the store: what the other tests would see."""
    left, _ = _run(tmp_path, [sys.executable, "-c",
                              SESSION.format(model=str(bundle / "model.onnx"))])
    assert "onnxruntime.db" in left


LIBRARY = ("from vit_deploy.runtime import ViTSession; import numpy as np; "
           "s = ViTSession({b!r}, provider='cpu'); s.run(np.zeros((1, 3, 32, 32), np.float32)); "
           "print(s.predict([{p!r}])[0])")
NODE = ("const {{ ViT }} = await import({web!r}); const v = await ViT.load({b!r}); "
        "console.log((await v.classify({p!r})).top)")


@pytest.mark.parametrize("entry", ["library", "cli predict", "cli check", "node",
                                   "cli predict openvino"])
def test_no_entry_point_writes_the_event_store_or_connects(tmp_path, bundle, entry):
    argv = {
        "library": [sys.executable, "-c", LIBRARY.format(b=str(bundle), p=str(PHOTO))],
        "cli predict": [sys.executable, "-m", "vit_deploy.cli", "predict", str(bundle), str(PHOTO)],
        "cli check": [sys.executable, "-m", "vit_deploy.cli", "check", str(bundle), "--quiet"],
        "cli predict openvino": [sys.executable, "-m", "vit_deploy.cli", "predict", str(bundle),
                                 str(PHOTO), "--provider", "openvino"],
        "node": ["node", "--input-type=module", "-e", NODE.format(
            web=(ROOT / "web" / "src" / "node.mjs").as_uri(), b=str(bundle), p=str(PHOTO))],
    }[entry]
    left, calls = _run(tmp_path, argv)
    assert left == [] and calls == [], (left, calls)
    # nothing of anyone's telemetry either (OpenVINO's keeps its consent and ids in HOME)
    written = sorted(str(p.relative_to(tmp_path / "home")) for p in (tmp_path / "home").rglob("*"))
    assert written == [], written


def test_the_control_openvino_alone_posts_on_import(tmp_path):
    """`import openvino` (2026.4) sends a usage event from a forked process: what the
    "cli predict openvino" case above would see without the runtime's quiet import."""
    left, calls = _run(tmp_path, [sys.executable, "-c", "import openvino, time; time.sleep(2)"])
    assert calls, "import openvino made no connection: the control no longer shows anything"
    assert (tmp_path / "home" / "intel").exists()


def test_the_documented_opt_in_lets_onnx_runtime_collect(tmp_path, bundle):
    left, _ = _run(tmp_path, [sys.executable, "-c", LIBRARY.format(b=str(bundle), p=str(PHOTO))],
                   **{ORT_TELEMETRY_OPT_IN: "1"})
    assert "onnxruntime.db" in left


@pytest.mark.parametrize("address, before, after", [("local", None, "0"), ("local", "1", "1"),
                                                     ("auto", None, None)])
def test_a_ray_cluster_we_start_reports_no_usage(monkeypatch, address, before, after):
    """`--ray local` starts a head node: Ray's usage statistics off unless the user set them
    on; a cluster we join keeps its own setting."""
    from vit_deploy.ray import cluster

    seen = {}
    monkeypatch.delenv(cluster.RAY_USAGE_STATS, raising=False)
    if before is not None:
        monkeypatch.setenv(cluster.RAY_USAGE_STATS, before)
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: seen.setdefault(
        "env", os.environ.get(cluster.RAY_USAGE_STATS)))
    monkeypatch.setattr(cluster.ray, "shutdown", lambda: None)
    with cluster.connected(address):
        pass
    assert seen["env"] == after
