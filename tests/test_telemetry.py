"""Nothing sent: ONNX Runtime's telemetry is off in every entry point before it loads.

ONNX Runtime's official wheels keep an event store (~/.cache/Microsoft/DeveloperTools/
.onnxruntime/onnxruntime.db, with a device id) from the moment the library loads, and upload
it when a network is there; CI variables (CI, TF_BUILD, GITHUB_ACTIONS, GITLAB_CI) suppress
it, so every run here unsets them, gives the process a fresh HOME and records its connect()
calls with strace. The control (ONNX Runtime alone) proves the store would be seen.
"""

from __future__ import annotations

import json
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
# The suite's own folders (tests/conftest.py): a user's run has HOME's own
MOVED = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "MPLCONFIGDIR",
         "npm_config_logs_dir", "VIT_DEPLOY_SUITE_XDG")
PHOTO = ROOT / "vit_deploy" / "data" / "photos" / "eval-chelsea.jpg"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, make_tiny):
    out = tmp_path_factory.mktemp("telemetry") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(  # pooled too: `search` embeds
        resolution=(32, 32), simplify=False, outputs=("logits", "pooled")))
    return out


def _offline(argv: list[str]) -> list[str]:
    """`argv` in a network namespace of its own: loopback up, no route off this machine, so
    nothing can leave whatever the trace below misses (as root, as `make test` runs; else in
    a user namespace too). unshare is util-linux's, ip iproute2's (Makefile, SYSTEM_STAMP)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    unshare, ip = shutil.which("unshare", path=path), shutil.which("ip", path=path)
    assert unshare and ip, "unshare / ip are missing: `make test` installs them"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [unshare, *user, "--net", "sh", "-c", f'"{ip}" link set lo up && exec "$@"', "sh",
            *argv]


def _run(tmp_path: Path, argv: list[str], *, traced: bool = True,
         **extra: str) -> tuple[list[str], list[str]]:
    """Run `argv` as a user would (no CI variables, a fresh HOME), in a network namespace
    with no route out; what it left in the event store's folder and the network connect()
    and send calls it tried (a datagram sent without connect() names its address too).
    `traced=False`: only the event store is asked about (no strace, no namespace)."""
    home = tmp_path / "home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in SUPPRESSORS + MOVED} | {
        "HOME": str(home)}
    trace = tmp_path / "connect.txt"
    strace = shutil.which("strace")
    assert strace, "strace is missing: `make test` installs it (Makefile, SYSTEM_STAMP)"
    if not traced:
        trace.write_text("")
    # --seccomp-bpf: the traced processes stop only at the three calls asked for, not at
    # every system call (an export under strace: 29 s with, 10 s without stops at each call,
    # 9 s untraced; the same calls recorded); where the kernel refuses the filter, strace
    # says so and stops at every call as before
    r = subprocess.run(_offline([strace, "-f", "--seccomp-bpf", "-qq", "-e",
                                 "trace=connect,sendto,sendmsg", "-o", str(trace), *argv])
                       if traced else argv,
                       env=env | extra, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    store = home / STORE
    left = sorted(p.name for p in store.iterdir()) if store.exists() else []
    calls = [line for line in trace.read_text().splitlines()
             if re.search(r"AF_INET6?\b", line) and not LOOPBACK.search(line)]
    return left, calls


# A connection to this machine itself (a server under test, Ray's own processes) sends nothing.
LOOPBACK = re.compile(r'inet_addr\("127\.|inet_pton\(AF_INET6, "::1"')


def _home_files(tmp_path: Path) -> list[str]:
    home = tmp_path / "home"
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


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
    assert _home_files(tmp_path) == []


NODE_SESSION = ("const ort = await import('onnxruntime-node'); "
                "await ort.InferenceSession.create({model!r});")


def test_the_web_packages_own_tests_write_no_event_store(tmp_path, bundle):
    """`npm test` in web/: the test files import onnxruntime-node themselves (not through the
    package's loader, which quiets it), so a developer's run kept ONNX Runtime's event store
    in their home. The test script loads testing/quiet-ort.mjs first; the control, the same
    session without it, keeps the store."""
    script = json.loads((ROOT / "web" / "package.json").read_text())["scripts"]["test"]
    assert script.startswith("node --import ./testing/quiet-ort.mjs --test "), script
    code = NODE_SESSION.format(model=str(bundle / "model.onnx"))
    node = ["node", "--input-type=module", "-e", code]
    in_web = ["sh", "-c", 'cd web && exec "$@"', "sh"]
    left, _ = _run(tmp_path, [*in_web, *node], traced=False)
    assert "onnxruntime.db" in left  # the control: what an unquieted test file leaves
    left, _ = _run(tmp_path, [*in_web, node[0], "--import", "./testing/quiet-ort.mjs",
                              *node[1:]], traced=False)
    assert left == [] and _home_files(tmp_path) == [], left


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
    for name in (cluster.RAY_USAGE_STATS, *cluster.RAY_AUTH):
        monkeypatch.setenv(name, "")  # recorded, so that the test leaves them as they were
        monkeypatch.delenv(name)
    if before is not None:
        monkeypatch.setenv(cluster.RAY_USAGE_STATS, before)
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: seen.update(
        env=os.environ.get(cluster.RAY_USAGE_STATS), token=os.environ.get("RAY_AUTH_TOKEN")))
    monkeypatch.setattr(cluster.ray, "shutdown", lambda: None)
    with cluster.connected(address):
        pass
    assert seen["env"] == after
    # a cluster we start gets a token of its own (none written to ~/.ray); one we join, none
    assert (seen["token"] is not None and len(seen["token"]) == 64) == (address == "local")


def test_a_ray_cluster_we_start_is_on_loopback(monkeypatch):
    """Started without an address, Ray found its node's address by a UDP connect to
    8.8.8.8:53 (strace, outside a network namespace: 2 connects per `embed --ray local`) and
    its nodes talked over the machine's public address. Now loopback, told as Ray is told
    (its one-machine switch, for its workers too); a cluster we join is left as it is."""
    from ray._private import ray_constants

    from vit_deploy.ray import cluster

    seen = {}
    monkeypatch.delenv(cluster.LOCAL_ONLY, raising=False)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: seen.update(
        kw, env=os.environ.get(cluster.LOCAL_ONLY), switch=ray_constants.ENABLE_RAY_CLUSTER))
    monkeypatch.setattr(cluster.ray, "shutdown", lambda: None)
    for name in (cluster.RAY_USAGE_STATS, *cluster.RAY_AUTH):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    with cluster.connected("local"):
        pass
    assert seen["_node_ip_address"] == "127.0.0.1" and not seen["include_dashboard"]
    assert seen["env"] == "0" and seen["switch"] is False
    seen.clear()
    monkeypatch.delenv(cluster.LOCAL_ONLY)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    with cluster.connected("auto"):
        pass
    assert "_node_ip_address" not in seen and seen["env"] is None and seen["switch"] is True


def _cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "vit_deploy.cli", *map(str, args)]


# `serve` as a client meets it: started, asked for /health until it answers, stopped.
SERVE = """
import socket, subprocess, sys, time, urllib.request
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
p = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "serve", {b!r}, "--port",
                      str(port), "--quiet"])
try:
    for _ in range(600):
        try:
            assert urllib.request.urlopen(f"http://127.0.0.1:{{port}}/health").status == 200
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("serve did not answer /health")
finally:
    p.terminate(); p.wait(30)
"""


# `search` after the in-process `embed` that writes its index (both traced)
SEARCH = "import subprocess; subprocess.run({embed!r}, check=True); subprocess.run({search!r}, check=True)"


def _commands(bundle: Path, copy: Path, work: Path) -> dict[str, list[str]]:
    """Every command of the CLI as a user runs it on the tiny bundle (those that add to a
    bundle on `copy`); `embed` starts a Ray cluster: its own test below."""
    return {
        "bench": _cli("bench", bundle, "--runs", 2, "--warmup", 1, "--quiet"),
        "check": _cli("check", bundle, "--quiet"),
        "export": _cli("export", "--model", "tiny", "--res", 32, "--out", work / "x", "--quiet"),
        "info": _cli("info", bundle),
        "predict": _cli("predict", bundle, PHOTO),
        "providers": _cli("providers"),
        "quantize": _cli("quantize", copy, "--precision", "fp16,int8", "--quiet"),
        "serve": [sys.executable, "-c", SERVE.format(b=str(bundle))],
        "sweep": _cli("sweep", bundle / "weights.safetensors", "--patch", 8, "--res", 32,
                      "--precision", "fp32", "--rounds", 1, "--runs", 2, "--quiet"),
        "target": _cli("target", copy, "--target", "cpu", "--buckets", 32, "--quiet"),
        "triton": _cli("triton", bundle, "--out", work / "triton", "--quiet"),
        "search": [sys.executable, "-c", SEARCH.format(embed=_cli(
            "embed", bundle, PHOTO, "--out", work / "i.parquet", "--quiet"), search=_cli(
            "search", bundle, work / "i.parquet", PHOTO, "--quiet"))],
        "web": _cli("web", bundle, "--out", work / "site", "--quiet"),
    }


WALKED = sorted(_commands(Path("b"), Path("c"), Path("w")))


def test_the_walk_covers_every_command():
    from vit_deploy.cli import main

    assert set(WALKED) | {"embed"} == set(main.list_commands(None))  # lazily loaded


@pytest.mark.parametrize("command", WALKED)
def test_no_command_sends_anything_or_writes_into_home(tmp_path, bundle, command):
    """Each command run as a user runs it (no CI variables, a fresh HOME): no connection
    off this machine, no telemetry store, nothing at all written into HOME."""
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    argv = _commands(bundle, copy, tmp_path)[command]
    left, calls = _run(tmp_path, argv)
    assert left == [] and calls == [], (left, calls)
    assert _home_files(tmp_path) == []


def test_embed_on_a_cluster_it_starts_leaves_home_alone(tmp_path, bundle, monkeypatch):
    """`embed --ray local` starts a Ray cluster in the process. Ray turns token
    authentication on for it and, with no token set, writes one to ~/.ray/auth_token, where
    every later `ray start` on the machine finds it; vit-deploy hands Ray a token of its own.
    It found its node's address by a UDP connect to 8.8.8.8:53; the cluster is now on
    127.0.0.1. Ray's dashboard still asks the cloud metadata address (link-local) with usage
    statistics off: docs/guarantees.md."""
    for name in ("RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                 "RAY_AUTH_TOKEN_PATH"):  # as a user runs it
        monkeypatch.delenv(name, raising=False)
    table = tmp_path / "features.parquet"
    _, calls = _run(tmp_path, _cli("embed", bundle, PHOTO, "--out", table, "--ray", "local",
                                   "--quiet"))
    assert table.is_file()
    assert _home_files(tmp_path) == []
    assert not [c for c in calls if "8.8.8.8" in c], calls  # only the metadata ask is left
    assert all(any(to in c for to in ("169.254.169.254", "htons(53)", '"::ffff:127.0.0.1"'))
               for c in calls), calls  # the metadata ask, its name's lookup, v4-in-v6 loopback


def test_openvino_is_imported_in_one_place():
    """Every module gets OpenVINO through runtime/providers.py's quiet import (a plain
    `import openvino` in `providers` and the provider probe wrote ~/intel/openvino_ga_cid)."""
    plain = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "vit_deploy").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.match(r"\s*(import|from) openvino\b", line)]
    assert plain and all(h.startswith("vit_deploy/runtime/providers.py:") for h in plain), plain


def test_every_script_loads_vit_deploy_before_onnx_runtime():
    """The project's scripts and benchmarks (make setup runs one) turn ONNX Runtime's
    telemetry off as the CLI does: vit_deploy is imported before onnxruntime in each (the
    DINOv2-S rebuild wrote ~/.cache/Microsoft/.../onnxruntime.db, caught by the suite's
    HOME check)."""
    late = []
    for path in sorted([*(ROOT / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]):
        lines = path.read_text().splitlines()
        ort_at = next((i for i, line in enumerate(lines)
                       if re.match(r"\s*(import onnxruntime|from onnxruntime)\b", line)), None)
        ours_at = next((i for i, line in enumerate(lines)
                        if re.match(r"\s*(import vit_deploy|from vit_deploy)\b", line)), None)
        if ort_at is not None and (ours_at is None or ours_at > ort_at):
            late.append(f"{path.relative_to(ROOT)}:{ort_at + 1}")
    assert late == [], late
