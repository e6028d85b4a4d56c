"""Execution providers: short aliases, availability, and what is really active."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import onnxruntime as ort

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


class ProviderError(RuntimeError):
    """A provider was asked for and cannot run."""


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
    if isinstance(spec, str):
        items: list[ProviderSpec] = [s for s in spec.split(",") if s.strip()]
    elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], Mapping):
        items = [spec]
    else:
        items = list(spec)
    if not items:
        raise ValueError("no provider given; use e.g. 'cpu' or 'cuda,cpu'")
    out: list[Provider] = []
    for item in items:
        name, options = (item, {}) if isinstance(item, str) else (item[0], dict(item[1]))
        provider = Provider(resolve_name(name), options)
        if provider.name not in [p.name for p in out]:
            out.append(provider)
    return out


def available() -> list[str]:
    """Providers this onnxruntime build lists. Listed is not the same as able to run."""
    return list(ort.get_available_providers())
