"""Floors per CPU: how fast this machine's matrix products run through ONNX Runtime (fp32
MatMul, int8 MatMulInteger: the kernels our fp32 and int8 graphs spend their time in), how
much matrix work a ViT does at a resolution, and so the least time a forward pass could take
here. `bench` reports each configuration as a fraction of its floor (floor / measured): 1.0
would be every product at the machine's peak and nothing else costing anything.

The peak is measured, not taken from a data sheet: a product the shape of the model's MLP
(tokens x width x mlp width), on the CPU provider with the bench's threads, best of the runs
(a floor is the least time, not a typical one)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import PRECISIONS

PEAK_KINDS = ("fp32", "int8")
INT8_PRECISIONS = frozenset(p for p in PRECISIONS if p.startswith("int8"))
PEAK_MIN_SECONDS = 0.3  # each peak: runs until this long has passed (and at least PEAK_MIN_RUNS)
PEAK_MIN_RUNS = 5


@dataclass(frozen=True)
class GemmPeak:
    """One kind of matrix product at its best on this machine: (m, k) x (k, n)."""

    kind: str  # fp32 | int8 | bf16 (OpenVINO only)
    shape: tuple[int, int, int]
    threads: int
    best_ms: float
    runs: int
    engine: str = "onnxruntime"  # onnxruntime | openvino (oneDNN / MLAS inside it)
    kernel: str | None = None  # what ran, where the engine says (OpenVINO: u8 brgemm_avx512_amx_I8)

    @property
    def gflops(self) -> float:
        """Multiply-adds x 2 per second, in 10^9 (int8: integer operations)."""
        m, k, n = self.shape
        return 2 * m * k * n / (self.best_ms / 1e3) / 1e9

    def to_dict(self) -> dict:
        return {"kind": self.kind, "shape": list(self.shape), "threads": self.threads,
                "best_ms": round(self.best_ms, 4), "runs": self.runs,
                "gflops": round(self.gflops, 1), "engine": self.engine,
                **({"kernel": self.kernel} if self.kernel else {})}


@dataclass(frozen=True)
class ModelWork:
    """The floating-point work of one image through a ViT, split by the kernel that does it:
    products with weights (int8 in an int8 graph) and attention's two activation products
    (fp32 in every graph of ours)."""

    weights_gflop: float
    attention_gflop: float

    @property
    def total_gflop(self) -> float:
        return self.weights_gflop + self.attention_gflop


def model_work(cfg: ViTConfig, resolution: tuple[int, int]) -> ModelWork:
    """Matrix work (multiply-adds x 2, in 10^9) of one image at `resolution` (H, W): the patch
    embedding, every block's qkv, projection, MLP (gated: three matrices) and attention at the
    tokens that block sees (ToMe merges counted), the head. Norms, softmax, GELU and the
    position resampling are left out (not matrix products)."""
    h, w = resolution
    p, d = cfg.patch_size, cfg.width
    patches = (h // p) * (w // p)
    hidden = int(round(d * cfg.mlp_ratio))
    mlp_mats = 3 if getattr(cfg, "mlp", "plain") == "gated" else 2
    weights = patches * cfg.in_chans * p * p * d  # patch embedding
    attention = 0
    tokens = cfg.num_prefix_tokens + patches
    merges = cfg.merge_schedule(patches) if cfg.merging else (0,) * cfg.depth
    for r in merges:
        weights += tokens * d * (3 * d + d + mlp_mats * hidden)
        attention += 2 * tokens * tokens * d  # Q K^T and A V over all heads
        tokens -= r
    weights += cfg.pooled_dim * cfg.num_classes if cfg.num_classes else 0
    weights += d * cfg.proj_dim
    return ModelWork(2 * weights / 1e9, 2 * attention / 1e9)


def best_peak(peaks: dict[str, GemmPeak], kind: str) -> GemmPeak:
    """The faster of the engines' peaks of `kind` (ORT's "int8", OpenVINO's "openvino-int8")."""
    return max((p for name, p in peaks.items() if name in (kind, f"openvino-{kind}")),
               key=lambda p: p.gflops)


def floor_ms(work: ModelWork, precision: str, peaks: dict[str, GemmPeak], batch: int = 1) -> float:
    """The least time for `batch` images at `precision` on this machine: weight products at
    the int8 peak for an int8 precision, the fp32 peak otherwise (fp16 and int4 graphs compute
    in fp32 on the CPU provider); attention at the fp32 peak. Each peak is the better of the
    engines measured (ONNX Runtime's; OpenVINO's where it is installed)."""
    weight_kind = "int8" if precision in INT8_PRECISIONS else "fp32"
    seconds = (work.weights_gflop / best_peak(peaks, weight_kind).gflops
               + work.attention_gflop / best_peak(peaks, "fp32").gflops)
    return batch * seconds * 1e3


def peak_shape(cfg: ViTConfig | None, resolution: tuple[int, int] | None) -> tuple[int, int, int]:
    """The MLP's product for this model and size (tokens, width, mlp width); ViT-B/16 at 224
    where the model is not known."""
    if cfg is None or resolution is None:
        return (197, 768, 3072)
    tokens = cfg.num_prefix_tokens + (resolution[0] // cfg.patch_size) * (resolution[1] // cfg.patch_size)
    return (tokens, cfg.width, int(round(cfg.width * cfg.mlp_ratio)))


def _gemm_model(kind: str, shape: tuple[int, int, int]) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = shape
    rng = np.random.default_rng(0)
    if kind == "fp32":
        b = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "B")
        nodes = [helper.make_node("MatMul", ["A", "B"], ["Y"])]
        a_type, y_type, inits = TensorProto.FLOAT, TensorProto.FLOAT, [b]
    elif kind == "int8":  # u8 activations x s8 weights, as ORT's dynamic int8 graphs run
        b = numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "B")
        a_zp = numpy_helper.from_array(np.array(128, np.uint8), "a_zp")
        b_zp = numpy_helper.from_array(np.array(0, np.int8), "b_zp")
        nodes = [helper.make_node("MatMulInteger", ["A", "B", "a_zp", "b_zp"], ["Y"])]
        a_type, y_type, inits = TensorProto.UINT8, TensorProto.INT32, [b, a_zp, b_zp]
    else:
        raise ValueError(f"peak kind: expected one of {', '.join(PEAK_KINDS)}, got {kind!r}")
    graph = helper.make_graph(nodes, f"peak_{kind}",
                              [helper.make_tensor_value_info("A", a_type, [m, k])],
                              [helper.make_tensor_value_info("Y", y_type, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def measure_peak(kind: str, *, threads: int, shape: tuple[int, int, int] = (197, 768, 3072),
                 min_seconds: float = PEAK_MIN_SECONDS) -> GemmPeak:
    """The best time of one (m, k) x (k, n) product of `kind` on ONNX Runtime's CPU provider
    with `threads` intra-op threads (ORT's own optimisations on, as bundles run)."""
    import onnxruntime as ort

    if threads < 1:
        raise ValueError(f"threads: expected an integer >= 1, got {threads}")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    session = ort.InferenceSession(_gemm_model(kind, shape), so,
                                   providers=["CPUExecutionProvider"])
    m, k, _ = shape
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((m, k), dtype=np.float32) if kind == "fp32"
         else rng.integers(0, 256, (m, k), dtype=np.uint8))
    best, runs = _best_ms(lambda: session.run(None, {"A": a}), min_seconds)
    return GemmPeak(kind, shape, threads, best, runs)


def _best_ms(run: Any, min_seconds: float) -> tuple[float, int]:
    """(the best time of `run()` in ms, how many runs): two warm-up runs (first-run
    allocations, pre-packing), then runs until min_seconds and PEAK_MIN_RUNS are both met."""
    for _ in range(2):
        run()
    times, start = [], time.perf_counter()
    while len(times) < PEAK_MIN_RUNS or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times), len(times)


def measure_peaks(*, threads: int, shape: tuple[int, int, int] = (197, 768, 3072),
                  min_seconds: float = PEAK_MIN_SECONDS) -> dict[str, GemmPeak]:
    """Both peaks, fp32 and int8, for one shape and thread count."""
    return {kind: measure_peak(kind, threads=threads, shape=shape, min_seconds=min_seconds)
            for kind in PEAK_KINDS}


OPENVINO_PEAK_KINDS = ("fp32", "bf16", "int8")


def measure_openvino_peak(kind: str, *, threads: int, shape: tuple[int, int, int] = (197, 768, 3072),
                          min_seconds: float = PEAK_MIN_SECONDS) -> GemmPeak:
    """The same product through OpenVINO's CPU plugin, an engine that reaches the CPU's tile
    and VNNI units through oneDNN: fp32, bf16 (its inference precision; measured by
    measure_openvino_peaks where the CPU lists BF16) and int8 (fake-quantised activations
    and weights, which OpenVINO runs as an int8 FullyConnected, its activation quantisation
    included). `kernel` is the
    precision and implementation OpenVINO's execution graph names for the product
    ('u8 brgemm_avx512_amx_I8', 'f32 gemm_mlas_f32')."""
    from vit_deploy.runtime.providers import import_openvino_quietly

    if kind not in OPENVINO_PEAK_KINDS:
        raise ValueError(f"OpenVINO peak kind: expected one of {', '.join(OPENVINO_PEAK_KINDS)}, "
                         f"got {kind!r}")
    if threads < 1:
        raise ValueError(f"threads: expected an integer >= 1, got {threads}")
    ov = import_openvino_quietly()
    ops = ov.opset13
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = param = ops.parameter([m, k], np.float32, name="A")
    w = ops.constant(rng.standard_normal((k, n), dtype=np.float32))
    if kind == "int8":  # u8 activations x s8 weights, as our QDQ graphs quantise them
        c = lambda v: ops.constant(np.array(v, np.float32))  # noqa: E731
        a = ops.fake_quantize(a, c(0.0), c(2.55), c(0.0), c(2.55), 256)
        w = ops.fake_quantize(w, c(-1.27), c(1.27), c(-1.27), c(1.27), 255)
    model = ov.Model([ops.matmul(a, w, False, False)], [param])
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
              "INFERENCE_PRECISION_HINT": "bf16" if kind == "bf16" else "f32"}
    compiled = ov.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    x = np.abs(rng.standard_normal((m, k), dtype=np.float32))
    best, runs = _best_ms(lambda: request.infer([x]), min_seconds)
    kernels = [f"{info['runtimePrecision'].astype(str)} {info['primitiveType'].astype(str)}"
               for info in (op.get_rt_info() for op in compiled.get_runtime_model().get_ordered_ops())
               if "layerType" in info and info["layerType"].astype(str) == "FullyConnected"]
    return GemmPeak(kind, shape, threads, best, runs, engine="openvino",
                    kernel=",".join(kernels) or None)


def measure_openvino_peaks(*, threads: int, shape: tuple[int, int, int] = (197, 768, 3072),
                           min_seconds: float = PEAK_MIN_SECONDS) -> dict[str, GemmPeak]:
    """OpenVINO's peaks as {"openvino-fp32": ..., ...}; {} where it is not installed. bf16
    only where the CPU device lists BF16 among its capabilities, as the engine runs it
    (runtime/ov_session.py): OpenVINO 2026.4 emulates it elsewhere ('bf16 jit_gemm_bf16' on
    an AVX-512 Xeon without BF16, 2026-12-07: 160 ms against fp32's 5.5 ms)."""
    import importlib.util

    if importlib.util.find_spec("openvino") is None:
        return {}
    from vit_deploy.runtime.ov_session import device_capabilities
    from vit_deploy.runtime.providers import import_openvino_quietly

    listed = device_capabilities(import_openvino_quietly().Core(), "CPU")
    return {f"openvino-{kind}": measure_openvino_peak(kind, threads=threads, shape=shape,
                                                      min_seconds=min_seconds)
            for kind in OPENVINO_PEAK_KINDS if kind != "bf16" or "BF16" in listed}
