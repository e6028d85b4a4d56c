"""Execution providers: short aliases, availability, and what is really active."""

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
    "openvino": "OpenVINOExecutionProvider",
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
    for full in ort.get_all_providers():
        if full.lower() == key.lower() or full.lower() == key.lower() + "executionprovider":
            return full
    raise ValueError(f"unknown provider {name!r}; known: {', '.join(sorted(ALIASES))} "
                     f"or a full ONNX Runtime name such as 'CUDAExecutionProvider'")


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


def available() -> list[str]:
    """Providers this onnxruntime build lists. Listed is not the same as able to run."""
    return list(ort.get_available_providers())


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
                "device": self.device,
                "providers": [r.__dict__ | {"alias": r.alias} for r in self.results]}

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        table = Table("provider", "alias", "usable here", title_justify="left",
                      title=f"onnxruntime {self.version}, from the {self.distribution} package")
        for r in self.results:
            table.add_row(r.name, r.alias, "yes" if r.usable else "no (see below)")
        notes = [f"{r.alias}: {r.reason}" for r in self.results if not r.usable]
        return Group(table, *notes, *([f"warning: {self.conflict}"] if self.conflict else []))


def probe_all() -> ProbeReport:
    return ProbeReport(ort.__version__, ort.get_device(), [probe(n) for n in available()],
                       distributions())
