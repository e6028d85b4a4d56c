"""Calibration in bounded memory: activation statistics gathered image by image.

ONNX Runtime's calibrators keep every intermediate output of every calibration image
until the end (a trained DINOv2-S at 224 with 36 calibration views: killed by the
out-of-memory killer at 24 GB), and augment every MatMul, the attention maps included.
Here only the tensors the quantiser needs (the inputs of the linear layers) are read, one
image at a time, and folded into running statistics as they arrive: min / max, or ONNX
Runtime's own histogram collector (entropy, percentile), which merges each image into
its histograms. Memory is one image's activations, whatever the number of images.
Torch-free.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from vit_deploy.progress import Progress, silent

# Entropy calibration's histogram: 512 bins searched for the 128-bin quantisation with the
# least KL divergence (ORT's search runs in Python: 2048 bins took 60 s on a 2-block test
# model, 512 take 3 s); percentile: 2048 bins (TensorRT's)
ENTROPY_BINS = 512
PERCENTILE_BINS = 2048


def images(batches: Iterable[np.ndarray]) -> Iterable[np.ndarray]:
    """Each image of `batches` as a batch of one."""
    for batch in batches:
        for i in range(len(batch)):
            yield np.ascontiguousarray(batch[i:i + 1], np.float32)


def count(batches: Sequence[np.ndarray]) -> int:
    return int(sum(len(b) for b in batches))


class Probe:
    """A CPU session of `model` that returns its own outputs and the tensors `names`."""

    def __init__(self, model: onnx.ModelProto, names: Sequence[str]):
        import onnxruntime as ort

        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        self.outputs = [o.name for o in probe.graph.output]
        self.names = [n for n in dict.fromkeys(names) if n not in self.outputs]
        probe.graph.output.extend([onnx.ValueInfoProto(name=n) for n in self.names])
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self._session = ort.InferenceSession(probe.SerializeToString(), so,
                                             providers=["CPUExecutionProvider"])
        self._feed = self._session.get_inputs()[0].name
        del probe

    def __call__(self, x: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(the model's outputs, the probed tensors) on one batch."""
        values = self._session.run(self.outputs + self.names, {self._feed: x})
        n = len(self.outputs)
        return dict(zip(self.outputs, values[:n])), dict(zip(self.names, values[n:]))


def stream(model: onnx.ModelProto, names: Sequence[str], batches: Sequence[np.ndarray],
           consume: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None], *,
           what: str = "calibrating", progress: Progress = silent) -> int:
    """Run `model` image by image over `batches`, handing each image's outputs and probed
    tensors to `consume`, which keeps what it needs; nothing else outlives the image."""
    probe = Probe(model, names)
    total = count(batches)
    for i, x in enumerate(images(batches)):
        consume(*probe(x))
        if total and (i + 1 == total or (i + 1) % max(1, total // 4) == 0):
            progress(f"{what}: image {i + 1}/{total}")
    return total


@dataclass
class Ranges:
    """Running statistics of tensors, one image at a time."""

    method: str = "minmax"  # minmax | entropy | percentile
    percentile: float = 99.999
    lo: dict[str, float] = field(default_factory=dict)
    hi: dict[str, float] = field(default_factory=dict)
    _histograms: Any = None

    def __post_init__(self) -> None:
        if self.method != "minmax":
            from onnxruntime.quantization.calibrate import HistogramCollector

            bins = ENTROPY_BINS if self.method == "entropy" else PERCENTILE_BINS
            self._histograms = HistogramCollector(self.method, symmetric=False, num_bins=bins,
                                                  num_quantized_bins=128,
                                                  percentile=self.percentile, scenario="same")

    def add(self, tensors: dict[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            lo, hi = float(value.min()), float(value.max())
            self.lo[name] = min(lo, self.lo.get(name, lo))
            self.hi[name] = max(hi, self.hi.get(name, hi))
        if self._histograms is not None:
            with contextlib.redirect_stdout(io.StringIO()):  # the collector print()s
                self._histograms.collect({k: [v] for k, v in tensors.items()})

    def result(self) -> dict[str, tuple[float, float]]:
        """{tensor: (rmin, rmax)}, zero always inside (as ORT's calibrators give)."""
        if self._histograms is None:
            ranges = {n: (self.lo[n], self.hi[n]) for n in self.lo}
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                found = self._histograms.compute_collection_result()
            ranges = {n: (float(np.asarray(v[0]).item()), float(np.asarray(v[1]).item()))
                      for n, v in found.items()}
        return {n: (min(lo, 0.0), max(hi, 0.0)) for n, (lo, hi) in ranges.items()}


def linear_inputs(model: onnx.ModelProto, nodes: Sequence[str]) -> list[str]:
    """The tensors static int8 quantises around the linear layers `nodes` (node names): the
    activation input of each, and the output of a Gemm (ONNX Runtime's QGemm takes a
    quantised output; MatMul outputs stay float)."""
    by_name = {n.name: n for n in model.graph.node}
    names = []
    for n in (by_name[n] for n in nodes if n in by_name):
        names += [n.input[0], *(n.output[:1] if n.op_type == "Gemm" else [])]
    return list(dict.fromkeys(names))


def activation_ranges(model: onnx.ModelProto, nodes: Sequence[str],
                      batches: Sequence[np.ndarray], *, method: str = "minmax",
                      percentile: float = 99.999,
                      progress: Progress = silent) -> dict[str, tuple[float, float]]:
    """{tensor: (rmin, rmax)} of the inputs of the linear layers `nodes`, streamed. The
    inputs of every linear layer are measured and remembered for the last (model, images,
    method): the recipe search quantises one model with other layers kept float, and the
    ranges do not depend on which."""
    def gather() -> dict[str, tuple[float, float]]:
        ranges = Ranges(method=method, percentile=percentile)
        names = linear_inputs(model, linear_nodes(model))
        stream(model, names, batches,
               lambda out, t: ranges.add({**t, **{k: v for k, v in out.items() if k in names}}),
               what=f"calibrating ({method})", progress=progress)
        return ranges.result()

    found = _ranges.get(_key(model, batches, method, percentile), gather)
    return {n: found[n] for n in linear_inputs(model, nodes)}


class Memo:
    """The statistics of the last `size` (model, images) keys: the recipe search fits its
    candidates on half the calibration images and the file on all of them, for int8 and
    int8-static alike, and each statistic is a full float pass (a minute for ViT-B/16 at
    448 on 2 cores). Small: scalars or one vector per channel."""

    def __init__(self, size: int = 2):
        self.size, self.entries = size, {}

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self.entries:
            while len(self.entries) >= self.size:
                self.entries.pop(next(iter(self.entries)))  # the oldest goes first
            self.entries[key] = compute()
        return self.entries[key]

    def clear(self) -> None:
        self.entries.clear()


_ranges = Memo()


def linear_nodes(model: onnx.ModelProto) -> list[str]:
    """Every MatMul / Gemm with a constant weight (a linear layer)."""
    inits = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node
            if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in inits]


def _key(model: onnx.ModelProto, batches: Sequence[np.ndarray], *extra: Any) -> str:
    digest = hashlib.sha256(model.SerializeToString())
    for b in batches:
        digest.update(repr((b.shape, str(b.dtype))).encode())
        digest.update(np.ascontiguousarray(b).data)
    digest.update(repr(extra).encode())
    return digest.hexdigest()


def write_cache(ranges: dict[str, tuple[float, float]], path: Path) -> Path:
    """The ranges as ONNX Runtime's calibration cache (quantize_static then skips its own
    calibrator and reads these)."""
    from onnxruntime.quantization.calibrate import (CalibrationMethod, TensorsData,
                                                    save_tensors_data)

    data = TensorsData(CalibrationMethod.MinMax,
                       {n: (np.float32(lo), np.float32(hi)) for n, (lo, hi) in ranges.items()})
    save_tensors_data(data, path)
    return path
