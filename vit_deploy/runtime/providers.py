"""Execution providers: short aliases, availability, and what is really active.

Two engines run a bundle: ONNX Runtime (its execution providers, full names such as
CUDAExecutionProvider) and OpenVINO (the `openvino` package: names OpenVINO:DEVICE, run by
runtime/ov_session.py, not by ONNX Runtime). ONNX Runtime's own OpenVINO provider is
`openvino-ep` (onnxruntime-openvino builds only)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import onnxruntime as ort

from vit_deploy.runtime.errors import FAILED, VitDeployError, require_arg

ALIASES: dict[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "openvino": "OpenVINO:CPU",  # the openvino package's CPU device (runtime/ov_session.py)
    "openvino-cpu": "OpenVINO:CPU",
    "openvino-gpu": "OpenVINO:GPU",
    "openvino-npu": "OpenVINO:NPU",
    "openvino-ep": "OpenVINOExecutionProvider",  # ONNX Runtime's (onnxruntime-openvino)
    "coreml": "CoreMLExecutionProvider",
    "dml": "DmlExecutionProvider",
    "directml": "DmlExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
}
CPU = "CPUExecutionProvider"
OPENVINO = "OpenVINO:"  # prefix of the OpenVINO engine's names: OpenVINO:CPU, OpenVINO:GPU.1
OPENVINO_INSTALL = "pip install 'vit-deploy[openvino]'"

ProviderSpec = Union[str, tuple[str, Mapping[str, Any]]]


class ProviderError(VitDeployError, RuntimeError):
    """A provider was asked for and cannot run."""

    exit_code = FAILED


@dataclass(frozen=True)
class Provider:
    name: str  # full ORT name
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def alias(self) -> str:
        return short_name(self.name)


def is_openvino(full: str) -> bool:
    """Whether `full` (a resolved name) is run by OpenVINO rather than ONNX Runtime."""
    return full.startswith(OPENVINO)


def openvino_device(full: str) -> str:
    """'OpenVINO:GPU.1' -> 'GPU.1', the device name OpenVINO takes."""
    return full[len(OPENVINO):]


def short_name(full: str) -> str:
    for alias, name in ALIASES.items():
        if name == full:
            return alias
    return full


def known_names() -> list[str]:
    return sorted(set(ALIASES) | set(ort.get_all_providers()), key=str.lower)


def resolve_name(name: str) -> str:
    """'CUDA' / 'cuda' / 'CUDAExecutionProvider' -> 'CUDAExecutionProvider'."""
    key = name.strip()
    if key.lower() in ALIASES:
        return ALIASES[key.lower()]
    if key.lower().startswith(OPENVINO.lower()) and len(key) > len(OPENVINO):
        return OPENVINO + key[len(OPENVINO):].upper()  # any OpenVINO device: openvino:gpu.1
    for full in ort.get_all_providers():
        if full.lower() == key.lower() or full.lower() == key.lower() + "executionprovider":
            return full
    raise ValueError(f"unknown provider {name!r}; known: {', '.join(sorted(ALIASES))}, "
                     f"a full ONNX Runtime name such as 'CUDAExecutionProvider', or "
                     f"'openvino:DEVICE'")


def parse_providers(spec: ProviderSpec | Sequence[ProviderSpec]) -> list[Provider]:
    """A name, 'cuda,cpu', or a list of names / (name, options) pairs, in preference order."""
    expected = ("a provider name ('cpu', 'cuda,cpu'), a (name, options) pair or a list of "
                "them")
    if isinstance(spec, str):
        items: list[ProviderSpec] = [s for s in spec.split(",") if s.strip()]
    elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], Mapping):
        items = [spec]
    else:
        require_arg("provider", spec, (list, tuple), expected)
        items = list(spec)
    if not items:
        raise ValueError("no provider given; use e.g. 'cpu' or 'cuda,cpu'")
    out: list[Provider] = []
    for item in items:
        if not isinstance(item, str):
            require_arg("provider", item, tuple, expected)
            if len(item) != 2 or not isinstance(item[0], str) or not isinstance(item[1], Mapping):
                raise TypeError(f"provider must be {expected}, got {str(item)[:60]}")
        name, options = (item, {}) if isinstance(item, str) else (item[0], dict(item[1]))
        provider = Provider(resolve_name(name), options)
        if provider.name not in [p.name for p in out]:
            out.append(provider)
    return out


# `import openvino` posts a usage event to Google Analytics from a forked process, unless the
# user declined in a consent file or the import runs in CI (openvino_telemetry, measured with
# 2026.4.1: a DNS lookup and an HTTPS POST on the first import in a process). Nothing of ours
# phones home: the import runs with the CI marker the library itself honours, set only for
# the import and restored after; the user's files and environment are left as they were.
# Opt in with VIT_DEPLOY_OV_TELEMETRY=1 (docs/guarantees.md).
OV_TELEMETRY_OPT_IN = "VIT_DEPLOY_OV_TELEMETRY"


def import_openvino_quietly() -> Any:
    if "openvino" in sys.modules or os.environ.get(OV_TELEMETRY_OPT_IN) == "1":
        import openvino as ov

        return ov
    before = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        import openvino as ov
    finally:
        if before is None:
            os.environ.pop("CI", None)
        else:
            os.environ["CI"] = before
    return ov


def available() -> list[str]:
    """Providers this onnxruntime build lists. Listed is not the same as able to run."""
    return list(ort.get_available_providers())


def openvino_devices() -> tuple[str, list[str]]:
    """(OpenVINO's version, the devices it lists here); ImportError where the openvino
    package is not installed. Imported only when asked: nothing else loads OpenVINO."""
    ov = import_openvino_quietly()

    return openvino_version(ov), list(ov.Core().available_devices)


def openvino_version(ov: Any) -> str:
    """'2026.4.1' of OpenVINO's '2026.4.1-22982-e213a147257-releases/2026/4'."""
    return str(ov.__version__).split("-")[0]


def openvino_lists(device: str, devices: Sequence[str]) -> bool:
    """Whether `device` ('GPU', 'GPU.1') is among OpenVINO's `devices` ('GPU.0', 'GPU.1')."""
    return any(d == device or d.startswith(device + ".") for d in devices)


# -- what ORT says when a provider fails ------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ORT_PREFIX = re.compile(r"^\S+ \S+ \[[EWIV]:onnxruntime:[^\]]*\]\s*")
_SOURCE_PREFIX = re.compile(r"(EP Error )?/onnxruntime_src/\S+:\d+ .*?(\[ONNXRuntimeError\] : \d+ : "
                            r"\w+ : |\) (?=[A-Z]))")


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Capture what ONNX Runtime says while a session is made: its native logger writes to
    file descriptor 2, its Python layer prints "EP Error ... Falling back" to stdout.

    Yields a list that holds the captured text once the block ends.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    box: list[str] = []
    printed = io.StringIO()
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            with contextlib.redirect_stdout(printed):
                yield box
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            box.append(tmp.read().decode("utf-8", errors="replace") + printed.getvalue())


def failure_reason(log: str) -> str:
    """The lines of an ORT log that explain a provider failure, cleaned of colour codes."""
    lines: list[str] = []
    for raw in _ANSI.sub("", log).splitlines():
        line = _SOURCE_PREFIX.sub("", _ORT_PREFIX.sub("", raw.strip())).strip()
        if "*****" in line or line.startswith(("when using", "Falling back")) or line in lines:
            continue
        if line and any(w in line for w in ("Fail", "fail", "Error", "error", "Require", "not ")):
            lines.append(line)
    return " | ".join(lines[-3:]) if lines else "onnxruntime printed no reason"


@dataclass(frozen=True)
class ProbeResult:
    name: str
    listed: bool
    usable: bool
    reason: str = ""

    @property
    def alias(self) -> str:
        return short_name(self.name)


def probe(name: str, options: Mapping[str, Any] | None = None) -> ProbeResult:
    """Try to create a session on `name` alone (a one-node model): does it really run here?"""
    full = resolve_name(name)
    if is_openvino(full):
        return _probe_openvino(full)
    if full not in available():
        return ProbeResult(full, listed=False, usable=False,
                           reason="not in this onnxruntime build's provider list")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    with captured_stderr() as log:
        try:
            session = ort.InferenceSession(model.SerializeToString(),
                                           providers=[(full, dict(options or {}))])
            active = session.get_providers()
            error = ""
        except Exception as e:  # ORT raises its own exception types
            active, error = [], str(e)
    if full in active:
        return ProbeResult(full, listed=True, usable=True)
    return ProbeResult(full, listed=True, usable=False, reason=error or failure_reason(log[0]))


def _probe_openvino(full: str) -> ProbeResult:
    """A one-node model compiled and run on the OpenVINO device `full` names."""
    try:
        import numpy as np

        ov = import_openvino_quietly()
        import openvino.opset13 as ops
    except ImportError:
        return ProbeResult(full, listed=False, usable=False,
                           reason=f"the openvino package is not installed ({OPENVINO_INSTALL})")
    core = ov.Core()
    device, devices = openvino_device(full), list(core.available_devices)
    if not openvino_lists(device, devices):
        return ProbeResult(full, listed=False, usable=False,
                           reason=f"OpenVINO {openvino_version(ov)} lists the devices "
                                  f"{devices} here")
    x = ops.parameter([1, 4], ov.Type.f32, name="x")
    try:
        compiled = core.compile_model(ov.Model([ops.relu(x)], [x], "probe"), device)
        compiled.create_infer_request().infer([np.zeros((1, 4), np.float32)])
    except RuntimeError as e:  # OpenVINO's errors are RuntimeErrors
        return ProbeResult(full, listed=True, usable=False, reason=str(e).strip()[:300])
    return ProbeResult(full, listed=True, usable=True)


def distributions() -> list[str]:
    """The installed distributions that provide the `onnxruntime` module: onnxruntime-gpu
    (CPU, CUDA, TensorRT) or onnxruntime (CPU; CoreML on macOS; ...), or another build
    (onnxruntime-openvino, -directml, -qnn). One normally: two overwrite each other's files."""
    from importlib.metadata import packages_distributions

    return sorted(set(packages_distributions().get("onnxruntime", [])), key=str.lower)


@dataclass(frozen=True)
class ProbeReport:
    """`vit-deploy providers`: what this onnxruntime lists and what really runs here."""

    version: str
    device: str
    results: list[ProbeResult]
    distributions: list[str] = field(default_factory=list)  # who installed `onnxruntime`
    openvino: str | None = None  # the openvino package's version; None: not installed

    @property
    def distribution(self) -> str:
        return " + ".join(self.distributions) or "unknown distribution"

    @property
    def conflict(self) -> str:
        """Why the install is broken, or ""."""
        if len(self.distributions) < 2:
            return ""
        return (f"{self.distribution} are all installed and share the `onnxruntime` module: "
                f"uninstall all of them, then install one")

    def to_dict(self) -> dict[str, Any]:
        return {"onnxruntime": self.version, "distributions": self.distributions,
                "device": self.device, "openvino": self.openvino,
                "providers": [r.__dict__ | {"alias": r.alias} for r in self.results]}

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        table = Table("provider", "alias", "usable here", title_justify="left",
                      title=f"onnxruntime {self.version}, from the {self.distribution} package")
        for r in self.results:
            table.add_row(r.name, r.alias, "yes" if r.usable else "no (see below)")
        notes = [f"{r.alias}: {r.reason}" for r in self.results if not r.usable]
        if self.openvino:
            notes.append(f"{OPENVINO}* rows: OpenVINO {self.openvino} (the openvino package) "
                         f"runs them, not onnxruntime")
        return Group(table, *notes, *([f"warning: {self.conflict}"] if self.conflict else []))


def probe_all() -> ProbeReport:
    """ONNX Runtime's listed providers, then OpenVINO's devices where it is installed."""
    results = [probe(n) for n in available()]
    try:
        version, devices = openvino_devices()
    except ImportError:
        version, devices = None, []
    results += [probe(OPENVINO + d) for d in devices]
    return ProbeReport(ort.__version__, ort.get_device(), results, distributions(), version)
