"""Fixtures shared by the tests. Tests ask for these by name (pytest injects them); nothing
here is imported as a module."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from vit_deploy.export import onnx as onnx_export
from vit_deploy.runtime.config import variant
from vit_deploy.runtime.providers import import_openvino_quietly
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.export.model import ViT, build_model

# The tiny model: width 48, depth 2, heads 3, patch 8, native 32x32 (a 4x4 grid).
TINY_KINDS = [("learned", "cls"), ("factorized", "mean")]


@pytest.fixture(autouse=True)
def _torch_threads():
    torch.set_num_threads(1)


# torch.onnx.export (dynamo) takes 3 s even for the tiny model, and the suite exports the same
# few models ~90 times: a third of its time. Within one run a trace of a module that was
# already traced (the same classes and methods, attributes, weights, example shape, dynamic
# shapes and output names) is served from memory, or from the file the other worker kept in
# the run's own folder (which the controller removes at the end); everything after the trace (our finishing,
# checks, simplification, parity, quantisation) runs as always. The exporter is deterministic
# (tests/test_trace_memo.py proves the memo gives the exporter's bytes), and a module with
# hooks or anything not plain data on it is always traced afresh. Subprocesses (the CLI
# tests) trace for real. A test that needs the exporter itself to run, or that patches a
# module-level function the model calls (the key sees classes, not modules):
# @pytest.mark.fresh_trace.
MEMO_MAX_BYTES = 64 << 20  # weights larger than this are traced every time
_traces: dict[str, bytes] = {}  # sha256 of the key -> the trace
_real_trace = onnx_export.trace
_fresh_trace = False  # set per test by the fresh_trace marker (_trace_memo below)


def trace_key(module: nn.Module, example: torch.Tensor, **kw) -> tuple | None:
    """Everything a trace depends on, or None where that cannot be told from plain data."""
    digest, parts, size = hashlib.sha256(), [], 0
    classes = {}
    for path, sub in module.named_modules():
        classes.setdefault(type(sub), None)
        parts.append((path, type(sub)))
        for name, value in vars(sub).items():
            if name in ("_parameters", "_buffers", "_modules"):
                continue
            if name.startswith("_") and isinstance(value, dict):
                if value:  # hooks
                    return None
                continue
            if not _plain(value):
                return None
            parts.append((path, name, repr(value)))
    for cls in classes:  # a method patched on a class changes the trace: key on the functions
        parts.append(tuple((name, _function_id(fn)) for klass in cls.__mro__
                           if klass not in (nn.Module, object)
                           for name, fn in vars(klass).items() if callable(fn)))
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        data = tensor.detach().contiguous().cpu()
        size += data.numel() * data.element_size()
        if size > MEMO_MAX_BYTES:
            return None
        digest.update(f"{name}{tuple(data.shape)}{data.dtype}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    kw["dynamic_shapes"] = repr(kw.get("dynamic_shapes"))
    return (tuple(parts), digest.hexdigest(), tuple(example.shape), example.dtype,
            repr(sorted(kw.items())))


def _function_id(fn) -> str:
    """A function as the same text in every process: its name and its code (nested code
    included), so a function patched in with another body has another id."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:  # a class or a builtin: its name says what it is
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    digest = hashlib.sha256()

    def add(code) -> None:
        digest.update(code.co_code)
        digest.update(repr(code.co_names).encode())
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                add(const)
            elif isinstance(const, frozenset):  # `in {...}`: its order follows the hash seed
                digest.update(repr(sorted(map(repr, const))).encode())
            else:
                digest.update(repr(const).encode())

    add(code)
    return f"{fn.__module__}.{fn.__qualname__}:{digest.hexdigest()}"


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(_plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


def memo_name(key: tuple) -> str:
    """The key as a file name, the same in every process (tests/test_trace_memo.py)."""
    return hashlib.sha256(repr(key).encode()).hexdigest()


def _memo_trace(module, example, **kw):
    key = None if _fresh_trace else trace_key(module, example, **kw)
    if key is None:
        return _real_trace(module, example, **kw)
    name = memo_name(key)
    if name not in _traces:
        folder = Path(os.environ[SUITE_HOME]) / "traces" if SUITE_HOME in os.environ else None
        saved = folder / f"{name}.onnx" if folder else None
        if saved is not None and saved.is_file():  # the other worker traced it
            _traces[name] = saved.read_bytes()
        else:
            _traces[name] = _real_trace(module, example, **kw).SerializeToString()
            if saved is not None:
                folder.mkdir(exist_ok=True)
                part = folder / f"{name}.{os.getpid()}.part"
                part.write_bytes(_traces[name])
                os.replace(part, saved)  # whole or absent for the other worker
    return onnx.load_from_string(_traces[name])  # a fresh proto: callers change theirs


# Tests write only inside their own temporary folders, never into the user's home. What the
# tools the suite runs would keep in HOME's XDG folders (Chromium's crash reports and dconf,
# matplotlib's font cache, npm's logs) goes to a folder of the session's own (the workers
# inherit it); pip's configuration stays the user's. At the end the run fails if anything
# in the real HOME appeared or changed (its toolchains and package caches aside, which the
# suite only reads).
HOME = Path.home()
HOME_UNWATCHED = {".pyenv", ".rustup", ".cargo", ".m2", ".claude", ".npm/_cacache", ".cache/pip"}
SUITE_HOME = "VIT_DEPLOY_SUITE_XDG"


def _home_state() -> dict[str, int]:
    """{path under HOME: mtime in ns (0 for a folder)}, the unwatched folders left out."""
    state: dict[str, int] = {}
    for root, dirs, files in os.walk(HOME):
        rel = Path(root).relative_to(HOME)
        dirs[:] = [d for d in dirs if (rel / d).as_posix() not in HOME_UNWATCHED]
        for name in dirs + files:
            try:
                st = (Path(root) / name).lstat()
            except OSError:
                continue
            state[(rel / name).as_posix()] = 0 if stat.S_ISDIR(st.st_mode) else st.st_mtime_ns
    return state


def _own_xdg_folders(config) -> None:
    if SUITE_HOME in os.environ:  # a worker: the controller's folders
        return
    top = Path(tempfile.mkdtemp(prefix="vit-deploy-suite-"))
    os.environ[SUITE_HOME] = str(top)
    pip_conf = Path(os.environ.get("XDG_CONFIG_HOME", HOME / ".config")) / "pip" / "pip.conf"
    if pip_conf.is_file():
        os.environ.setdefault("PIP_CONFIG_FILE", str(pip_conf))
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
                 "MPLCONFIGDIR", "npm_config_logs_dir"):
        (top / name).mkdir()
        os.environ[name] = str(top / name)
    # Ray clusters the suite starts authenticate with a token of the run's own (set before any
    # test module imports Ray, which reads the mode once per process), never ~/.ray's
    if not any(os.environ.get(n) for n in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                                           "RAY_AUTH_TOKEN_PATH")):
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    config.stash[_HOME_BEFORE] = _home_state()


_HOME_BEFORE = pytest.StashKey[dict]()


def _pin_worker_to_its_cores() -> None:
    """Under `-n N` on a machine of C cores, worker i keeps cores i, i+N, ... to itself. ONNX
    Runtime and PyTorch size their thread pools by the cores a process may use (and the
    processes a test starts inherit them): unpinned, two workers on two cores each ran two
    spinning intra-op threads, four threads fighting for two cores. Numerics do not depend
    on it; timings are never asserted (benchmarks measure them, alone)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and count and hasattr(os, "sched_setaffinity")):
        return
    cores, index, count = sorted(os.sched_getaffinity(0)), int(worker.removeprefix("gw")), int(count)
    if count <= len(cores):
        os.sched_setaffinity(0, cores[index::count])


def pytest_configure(config):
    onnx_export.trace = _memo_trace  # for the whole session: fixtures of every scope
    _own_xdg_folders(config)
    _pin_worker_to_its_cores()


def pytest_sessionfinish(session, exitstatus):
    before = session.config.stash.get(_HOME_BEFORE, None)
    if before is None:  # a worker
        return
    shutil.rmtree(os.environ.pop(SUITE_HOME), ignore_errors=True)
    after = _home_state()
    touched = sorted(p for p in after if before.get(p) != after[p])
    if touched:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"FAILED: the suite wrote into {HOME}: {', '.join(touched[:20])}",
                                red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def trace_memo():
    """The memo's parts, for its own tests: .real (the exporter), .memo, .key, .name (the
    key's file name)."""
    from types import SimpleNamespace
    return SimpleNamespace(real=_real_trace, memo=_memo_trace, key=trace_key, name=memo_name)


@pytest.fixture(autouse=True)
def _trace_memo(request):
    global _fresh_trace
    _fresh_trace = request.node.get_closest_marker("fresh_trace") is not None
    yield
    _fresh_trace = False


def _tiny(pos_embed: str = "learned", pool: str = "cls", **kw) -> ViT:
    return build_model(variant("tiny", pos_embed=pos_embed, pool=pool, **kw), seed=0)


def _torch_logits(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


@pytest.fixture(scope="session")
def make_tiny() -> Callable[..., ViT]:
    """make_tiny(pos_embed="learned", pool="cls", **config overrides) -> a tiny ViT, seed 0
    (the same weights on every call)."""
    return _tiny


@pytest.fixture(scope="session")
def torch_logits() -> Callable[[torch.nn.Module, np.ndarray], np.ndarray]:
    """torch_logits(model, x) -> the model's logits for the float32 batch x, as numpy."""
    return _torch_logits


@pytest.fixture(scope="session")
def tiny_bundle(request, tmp_path_factory):
    """A tiny model and its exported dynamic bundle (one export per kind per session), of
    each kind in TINY_KINDS (pytest_generate_tests)."""
    pos_embed, pool = request.param
    model = _tiny(pos_embed, pool)
    out = tmp_path_factory.mktemp("bundles") / f"tiny-{pos_embed}-{pool}"
    result = export_bundle(model, out, options=ExportOptions(resolution=(48, 64)))
    return model, result


# Files whose subject is not the model's kind (servers, bench, hostile input, reliability,
# int8 kernels, Triton): the tiny bundle of the first kind only. The kinds differ in the
# graph (position table, pooling), which the export, runtime and parity tests cover with both;
# these files ran every test twice for nothing (2026-12-06: about 2 minutes of the suite).
ONE_TINY_KIND_FILES = {
    "test_bench.py", "test_server_hostile.py", "test_server.py", "test_int8_cpu.py",
    "test_reliability.py", "test_cli_errors.py", "test_hostile_table.py", "test_ownership.py",
    "test_triton.py", "test_hostile_cli.py",
}


def pytest_generate_tests(metafunc):
    if "tiny_bundle" in metafunc.fixturenames:
        one = metafunc.definition.path.name in ONE_TINY_KIND_FILES
        metafunc.parametrize("tiny_bundle", TINY_KINDS[:1] if one else TINY_KINDS,
                             indirect=True, scope="session", ids=lambda p: f"{p[0]}-{p[1]}")


@pytest.fixture(scope="session")
def quantised_bundle(tmp_path_factory):
    """A tiny bundle (deploy 24x40) with int8 (dynamic) and int4 models; treat as read-only."""
    from vit_deploy.precisions.add import add_precisions

    out = tmp_path_factory.mktemp("quantised") / "b"
    export_bundle(_tiny(), out, options=ExportOptions(resolution=(24, 40), simplify=False))
    add_precisions(out, ["int8", "int4"])
    return out


@pytest.fixture
def openvino_without_bf16(monkeypatch):
    """openvino.Core as this CPU's, but for BF16 left out of the CPU device's capability list
    (what a CPU without AMX or AVX-512 BF16 lists), so a refusal is tested on any CPU."""
    ov = import_openvino_quietly()  # as the product imports it: no usage event posted

    class NoBF16(ov.Core):
        def get_property(self, device, name):
            value = super().get_property(device, name)
            if name == "OPTIMIZATION_CAPABILITIES":
                return [c for c in value if c != "BF16"]
            return value

    monkeypatch.setattr(ov, "Core", NoBF16)


# `make test-fast` (the edit loop, under 90 s on 2 cores) leaves out the files that start
# servers, browsers, emulators or fresh virtual environments, kill processes, or export
# many models; `make test` runs everything. A test elsewhere can opt out with
# @pytest.mark.heavy.
HEAVY_FILES = {
    "test_reliability.py", "test_readme.py", "test_bundle.py", "test_web.py",
    "test_web_package.py", "test_dense.py", "test_onnx.py", "test_targets.py",
    "test_benchmarks.py", "test_sweep.py", "test_naflex_trained.py",
    "test_ownership.py", "test_tome.py", "test_flexivit.py", "test_tensorrt.py", "test_fuzz.py",
    "test_telemetry.py", "test_tour.py", "test_triton.py",
    "test_digits.py", "test_install.py", "test_recovery.py", "test_bench.py",
    "test_references.py", "test_arm64.py", "test_fusions.py", "test_openvino.py",
    # Qualcomm's HTP emulator (every test needs the npu target built: 19 s of one worker
    # before its quick tests, 2026-12-07 on an AVX-512 Xeon without AMX) and the trace
    # memo's own proofs (the real exporter, 16 s): the edit loop was 2 min 41 s there
    "test_htp.py", "test_trace_memo.py", "test_local_kill.py",
}
# In the packages' files, the slow tests only (2026-12-02: each over 2 s with its setup), so
# make test-fast runs the quick tests of every package (checkpoints, families, the hub
# cache, serve, v2, hostile clients) and leaves these to make test.
HEAVY_TESTS = {
    "test_checkpoints.py": {"test_hf_checkpoint_matches_transformers_in_torch_and_onnx"},
    "test_families.py": {"test_tower_matches_transformers_in_torch_and_onnx",
                         "test_int8_bundle_keeps_the_embedding"},
    "test_hub.py": {"test_hf_name_exports_with_its_preprocessing_labels_and_commit",
                    "test_timm_name_exports_with_pretrained_cfg_and_label_names"},
    "test_server_hostile.py": {
        "test_slow_bodies_never_keep_fast_requests_out",
        "test_half_open_connections_are_bounded_and_closed_after_the_header_timeout",
        "test_a_huge_declared_body_is_refused_before_it_is_read",
        "test_a_trickle_is_cut_by_the_minimum_rate_and_a_steady_slow_body_is_not",
        "test_at_the_connection_limit_the_slowest_body_makes_way",
        "test_a_slow_body_is_answered_408_and_closed",
        "test_bytes_held_are_what_arrived_not_what_was_declared",
        "test_sigterm_during_slow_uploads_shuts_down_without_tracebacks",
        "test_a_low_descriptor_limit_is_not_exhausted_and_logs_stay_small"},
}


# The longest files first (seconds in one quiet `make test`, 2026-12-01), so the two workers
# finish close together (longest processing time first): `make test` hands whole files to
# the workers in collection order (--no-loadscope-reorder, pytest-xdist >= 3.8; xdist would
# otherwise order files by their number of tests).
LONGEST_FIRST = ["test_trained_dinov2s.py",  # ~240 (2026-12-04): the trained DINOv2-S to int8
                 "test_tour.py",  # the README's tour, every line in order (tiny stand-in)
                 "test_docs_snippets.py",  # every docs page's snippets in order (~75 s of CPU)
                 "test_ray.py",  # ~110: a two-node Ray cluster, Serve and Data on it
                 "test_local_kill.py",  # ~15: embed --ray local, SIGKILLed
                 "test_install.py",  # 74: the wheel in fresh venvs, every platform resolved
                 "test_telemetry.py",  # 67 (2026-12-06, AVX-512 EPYC): every command traced
                 "test_readme.py",  # 49: the README's ViT-B/16 export
                 "test_htp.py",  # 47 (2026-12-06): Qualcomm's HTP emulator
                 "test_web.py", "test_server_hostile.py", "test_photos.py",  # 42, 38, 35
                 "test_bench.py",  # 30 (2026-12-06)
                 "test_checkpoints.py",  # 26
                 "test_openvino.py", "test_published.py",  # 25, 25 (2026-12-06)
                 "test_tome.py", "test_sweep.py", "test_reliability.py",  # 25, 24, 23
                 "test_int8_cpu.py", "test_families.py", "test_recovery.py",  # 22, 18, 17
                 "test_ownership.py", "test_dense.py", "test_server_v2.py",  # 17, 16, 11
                 "test_web_package.py", "test_cli.py", "test_references.py",  # 10, 10, 9
                 "test_benchmarks.py"]  # 9; the rest under 8


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (item.path.name in HEAVY_FILES
                or item.originalname in HEAVY_TESTS.get(item.path.name, ())):
            item.add_marker(pytest.mark.heavy)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file
