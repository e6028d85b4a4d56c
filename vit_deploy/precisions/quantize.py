"""fp32 ONNX -> fp16 / int8 dynamic / int8 static (QDQ) / int4 weight-only.

Only the linear layers are quantised: those inside the encoder blocks (qkv, proj, fc1,
fc2) and the classifier head (measured harmless: docs/precisions.md); the patch embedding,
position resampling, LayerNorm, Softmax and GELU stay float (docs/precisions.md, "Recipes"). Layers are named by module path (`blocks.3.mlp.fc2`), mapped to ONNX
node names through the metadata the exporter stores. Needs onnx + onnxruntime only.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from vit_deploy.precisions.fp16 import fp16_file
from vit_deploy.precisions.fusions import fuse_for_cpu
from vit_deploy.progress import Progress, silent
from vit_deploy.runtime.files import write_bytes_atomic
from vit_deploy.runtime.errors import FAILED, VitDeployError
from vit_deploy.runtime.contract import IR_VERSION, METADATA_LINEARS_KEY, PRECISIONS
from vit_deploy.runtime.cpu import ANY_CPU, INT8_CPUS, REQUIREMENT_TEXT
from vit_deploy.runtime.recipe import CALIBRATION_METHODS, INT8_KINDS, Int8Recipe

FP16_KEEP_FP32 = ("LayerNormalization", "Softmax", "Resize")  # overflow / precision-sensitive


class QuantizeError(VitDeployError, RuntimeError):
    """The quantiser failed or produced a model that does not load."""

    exit_code = FAILED


@dataclass(frozen=True, kw_only=True)
class QuantOptions:
    exclude: tuple[str, ...] = ()  # module paths kept float, e.g. ("blocks.3.mlp.fc2",)
    per_channel: bool = True
    # The CPUs an int8 file must be exact on (runtime/cpu.py). "any": 7-bit weights
    # (ORT's reduce_range), exact on every CPU; "vnni": 8-bit weights, which saturate the
    # 16-bit sums of x86 CPUs with AVX2 only (factorized-mean test model: cosine 0.92 there
    # vs 0.9999 on AMX). The recipe records it; the runtime warns on a CPU that lacks it.
    cpu: str = ANY_CPU
    calibration: str = "minmax"  # int8-static: minmax | entropy | percentile
    percentile: float = 99.999
    block_size: int = 32  # int4: weights per quantisation block
    head: bool = True  # quantise the classifier head too (measured harmless, docs/precisions.md)
    # int8 (a CPU precision, ORT-only anyway): erf-GELU as ORT's contrib Gelu, bit-exact
    # and 3.5 % faster on ViT-B/16 (ORT's session optimiser does not fuse the exporter's
    # pattern itself; its offline FusionGelu, which fuse_gelu runs, does).
    fuse_gelu: bool = True
    fuse_attention: bool = False  # ORT's MultiHeadAttention: measured, not kept (cpu-speed.md)
    fp16_keep_fp32: tuple[str, ...] = FP16_KEEP_FP32
    fp16_keep_nodes: tuple[str, ...] = ()  # nodes kept float32 by name (fp16_ranges.py)
    # int8 / int8-static: SmoothQuant-style scale migration (smooth.py) with this alpha,
    # folded into the graph before quantising; its statistics come from the calibration
    # images. None: no smoothing.
    smooth: float | None = None
    # int8-static: 16 quantises the activations to uint16 (w8a16, as Qualcomm's NPUs run
    # ViTs; QDQ in the com.microsoft domain below opset 21), the weights staying int8
    activation_bits: int = 8

    @property
    def reduce_range(self) -> bool:
        """7-bit weights: what keeps the u8 x s8 pair sums of AVX2 kernels in 16 bits."""
        return self.cpu == ANY_CPU

    def __post_init__(self) -> None:
        if self.calibration not in CALIBRATION_METHODS:
            raise ValueError(f"calibration must be one of {CALIBRATION_METHODS}, got "
                             f"{self.calibration!r}")
        if self.cpu not in INT8_CPUS:
            raise ValueError(f"int8 CPU must be one of {INT8_CPUS}, got {self.cpu!r}")
        if self.activation_bits not in (8, 16):
            raise ValueError(f"activation bits must be 8 or 16, got {self.activation_bits!r}")
        if self.smooth is not None and not (isinstance(self.smooth, (int, float))
                                            and 0.0 <= self.smooth <= 1.0):
            raise ValueError(f"smoothing alpha must be a number within [0, 1], got "
                             f"{self.smooth!r}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {self.block_size}")

    @classmethod
    def following(cls, recipe: Int8Recipe | None, layers: Iterable[str]) -> QuantOptions:
        """Options that quantise another graph of the same model as `recipe` did (its
        float-kept layers among `layers`, calibration, smoothing); portable weights unless
        the recipe says 'vnni' (`Int8Recipe.new_graph_cpu`). No recipe: the defaults."""
        if recipe is None:
            return cls()
        known = set(layers)
        kept = [p for p in recipe.kept_float_layers if p in known]
        return cls(exclude=tuple(p for p in kept if p != "head"), head="head" not in kept,
                   calibration=recipe.calibration or "minmax", cpu=recipe.new_graph_cpu,
                   smooth=recipe.smoothing,
                   **({"percentile": recipe.percentile} if recipe.percentile else {}))

    def int8_recipe(self, precision: str, quantised: Iterable[str],
                    kept: Iterable[str]) -> Int8Recipe:
        """The typed recipe of an int8 / int8-static file these options write."""
        static = precision == "int8-static"
        return Int8Recipe(kind=INT8_KINDS[static], cpu=self.cpu,
                          calibration=self.calibration if static else None,
                          percentile=self.percentile if static and
                          self.calibration == "percentile" else None,
                          smoothing=self.smooth, quantised_layers=tuple(quantised),
                          kept_float_layers=tuple(kept))


@dataclass
class QuantResult:
    path: Path
    precision: str
    recipe: dict[str, Any] = field(default_factory=dict)


def linear_layers(model: onnx.ModelProto) -> dict[str, str]:
    """{module path: node name} of every linear layer, in graph order."""
    meta = {p.key: p.value for p in model.metadata_props}
    if METADATA_LINEARS_KEY not in meta:
        raise QuantizeError("the model has no map of its linear layers (export it with "
                            "vit-deploy; other ONNX files are not supported here)")
    mapping = json.loads(meta[METADATA_LINEARS_KEY])
    names = {n.name for n in model.graph.node}
    stale = [path for path, node in mapping.items() if node not in names]
    if stale:
        raise QuantizeError(f"linear layers {stale[:3]} are no longer in the graph")
    return mapping


def quantisable_layers(model: onnx.ModelProto, *, head: bool = False) -> dict[str, str]:
    """The encoder's linear layers (qkv, proj, fc1, fc2 of every block), and the head if
    asked for."""
    return {path: node for path, node in linear_layers(model).items()
            if path.startswith("blocks.") or (head and path == "head")}


def quantize_model(src: str | Path, dst: str | Path, *, precision: str,
                   options: QuantOptions = QuantOptions(),
                   calibration: Sequence[np.ndarray] | None = None,
                   progress: Progress = silent) -> QuantResult:
    """Write `precision` of the fp32 model `src` to `dst` (atomically). Calibration and
    smoothing statistics are streamed image by image (calibrate.py)."""
    if precision not in PRECISIONS or precision == "fp32":
        raise ValueError(f"precision must be one of {[p for p in PRECISIONS if p != 'fp32']}, "
                         f"got {precision!r}")
    model = _clean(onnx.load(str(src)))
    layers = quantisable_layers(model, head=options.head)
    unknown = sorted(set(options.exclude) - set(linear_layers(model)))
    if unknown:
        raise ValueError(f"--exclude names unknown layers {unknown}; layers are "
                         f"{list(layers)[:4]} ...")
    chosen = {p: n for p, n in layers.items() if p not in options.exclude}
    if "head" in chosen and precision in ("int8", "int4"):
        # ORT quantises MatMul dynamically, not Gemm. int8-static keeps the Gemm (ORT runs
        # it as QGemm); as MatMul + Add, ORT's optimiser fuses them back into a float Gemm
        _gemm_to_matmul(model, chosen["head"])
    kept = [p for p in linear_layers(model) if p not in chosen]
    recipe: dict[str, Any] = {"precision": precision, "quantised_layers": list(chosen),
                              "kept_float_layers": kept}
    int8 = (options.int8_recipe(precision, chosen, kept)
            if precision in ("int8", "int8-static") else None)
    if int8 is not None:
        recipe.update(int8.record())
    if int8 is not None and int8.smoothing is not None:
        if not calibration:
            raise ValueError("smoothing needs calibration images (its per-channel "
                             "statistics): --calib, or the shipped photographs")
        from vit_deploy.precisions.smooth import smooth_model

        with _quiet_quantizer():
            model, smoothed = smooth_model(model, list(chosen.values()), calibration,
                                           int8.smoothing)
        recipe["smoothing"].update(layernorms=smoothed, method="SmoothQuant scale migration, "
                                   "LayerNorm -> qkv / fc1, folded into the graph")
    with tempfile.TemporaryDirectory() as tmp:
        src_tmp, out_tmp = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(model, str(src_tmp))
        if precision == "int8":
            _int8_dynamic(src_tmp, out_tmp, model, list(chosen.values()), options)
            recipe.update(weights=_weights_text(options),
                          activations="uint8, quantised at run time",
                          cpu_needs=REQUIREMENT_TEXT[options.cpu])
        elif precision == "int8-static":
            if not calibration:
                raise ValueError("int8-static needs calibration images (--calib)")
            _int8_static(src_tmp, out_tmp, list(chosen.values()), options, calibration,
                         progress)
            recipe.update(weights=_weights_text(options),
                          activations="uint16" if options.activation_bits == 16 else "int8",
                          cpu_needs=REQUIREMENT_TEXT[options.cpu], quantised_outputs=False,
                          calibration_images=int(sum(len(c) for c in calibration)))
        elif precision == "int4":
            _int4(model, out_tmp, list(chosen.values()), options)
            recipe.update(kind="weight-only MatMulNBits", weights=f"int4 symmetric, block "
                          f"{options.block_size}", activations="float32", accuracy_level=4)
        else:  # fp16
            fp16_file(model, out_tmp, options.fp16_keep_fp32, options.fp16_keep_nodes)
            recipe.update(quantised_layers=[], kept_float_layers=[],
                          kind="float16 weights and compute", io="float32",
                          kept_fp32_ops=list(options.fp16_keep_fp32),
                          kept_fp32_nodes=list(options.fp16_keep_nodes))
        if precision in ("int8", "int8-static"):  # CPU precisions: ORT's contrib kernels
            recipe.update(fuse_for_cpu(out_tmp, model, gelu=options.fuse_gelu,
                                       attention=options.fuse_attention))
        out = onnx.load(str(out_tmp))
    out.ir_version = IR_VERSION
    del out.metadata_props[:]
    out.metadata_props.extend(model.metadata_props)
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as e:
        raise QuantizeError(f"{precision} model fails the ONNX checker: {e}") from e
    recipe["kept_float"] = ["patch embedding", "position resampling", "LayerNorm", "Softmax",
                            "GELU"] + ([] if "head" in chosen else ["head"]) \
        if precision != "fp16" else list(options.fp16_keep_fp32)
    recipe["nodes"] = len(out.graph.node)
    return QuantResult(write_bytes_atomic(dst, out.SerializeToString()), precision, recipe)


def _weights_text(options: QuantOptions) -> str:
    return (f"int8 per-{'channel' if options.per_channel else 'tensor'}, "
            f"{7 if options.reduce_range else 8}-bit range")


def _clean(model: onnx.ModelProto) -> onnx.ModelProto:
    """Stale value_info from the dynamo export breaks ORT's quantiser's shape inference."""
    del model.graph.value_info[:]
    model.ir_version = IR_VERSION
    return model


def _gemm_to_matmul(model: onnx.ModelProto, name: str) -> None:
    """Rewrite Gemm(A, W, b, transB) as MatMul(A, W') + b, keeping the node's name on the
    MatMul (the quantisers handle MatMul with a constant weight)."""
    from onnx import numpy_helper

    node = next(n for n in model.graph.node if n.name == name)
    if node.op_type != "Gemm":
        return
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        raise QuantizeError(f"cannot rewrite Gemm {name!r} with attributes {attrs}")
    inits = {i.name: i for i in model.graph.initializer}
    weight = numpy_helper.to_array(inits[node.input[1]])
    if attrs.get("transB", 0):
        weight = weight.T
    w_name = f"{node.input[1]}_matmul"
    model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight), w_name))
    mid = f"{node.output[0]}_nobias"
    matmul = onnx.helper.make_node("MatMul", [node.input[0], w_name],
                                   [mid if len(node.input) > 2 else node.output[0]], name=name)
    new = [matmul]
    if len(node.input) > 2 and node.input[2]:
        new.append(onnx.helper.make_node("Add", [mid, node.input[2]], [node.output[0]],
                                         name=f"{name}_bias"))
    index = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    for offset, n in enumerate(new):
        model.graph.node.insert(index + offset, n)
    if not any(node.input[1] in n.input for n in model.graph.node):
        model.graph.initializer.remove(inits[node.input[1]])


def _int8_dynamic(src: Path, dst: Path, model: onnx.ModelProto, nodes: list[str],
                  options: QuantOptions) -> None:
    """ORT's quantize_dynamic of `src` (`model`, saved), the per-channel weight scales found
    for each tensor at once (weights.py: the same bytes; DINOv2-S 2.1 s -> 1.0 s)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from vit_deploy.precisions.weights import per_channel_overrides

    if not nodes:
        raise ValueError("every linear layer is excluded: nothing to quantise")
    extra: dict[str, Any] = {"MatMulConstBOnly": True}
    if options.per_channel:
        extra["TensorQuantOverrides"] = per_channel_overrides(
            model, nodes, reduce_range=options.reduce_range)
    with _quiet_quantizer():
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul", "Gemm"],
                         nodes_to_quantize=nodes, per_channel=options.per_channel,
                         reduce_range=options.reduce_range, weight_type=QuantType.QInt8,
                         extra_options=extra)


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ORT's quantisers talk: advice on the root logger ('consider pre-processing': the
    graph is already shape-inferred and simplified by the export), hundreds of INFO lines
    from the int4 quantiser, whose module calls logging.basicConfig(level=INFO) when it is
    imported, and print()s from the calibrators. None of it reaches the user, and the root
    logger is left as it was found (no handler or level of ORT's stays behind)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


def _int8_static(src: Path, dst: Path, nodes: list[str], options: QuantOptions,
                 calibration: Sequence[np.ndarray], progress: Progress = silent) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from vit_deploy.precisions.calibrate import activation_ranges, write_cache

    if not nodes:
        raise ValueError("every linear layer is excluded: nothing to quantise")
    # The activation ranges, streamed image by image (calibrate.py): ORT's own calibrator
    # keeps every intermediate of every image until the end (a trained DINOv2-S at 224 was
    # killed at 24 GB) and reads every MatMul's tensors, attention maps included. Given as
    # ORT's calibration cache, quantize_static runs no calibrator of its own.
    ranges = activation_ranges(onnx.load(str(src)), nodes, calibration,
                               method=options.calibration, percentile=options.percentile,
                               progress=progress)
    # Only the inputs of the linear layers are quantised, not their outputs: ONNX Runtime then
    # fuses Q -> DQ -> MatMul into MatMulIntegerToFloat for every layer. With quantised
    # outputs it made QLinearMatMul of 37 of ViT-B/16's 49 and left 12 (the fc1 layers) as
    # DequantizeLinear + fp32 MatMul, dequantising their weights on every run: 3.7x slower
    # than dynamic int8 (docs/cpu-speed.md).
    extra: dict[str, Any] = {"MatMulConstBOnly": True,
                             "OpTypesToExcludeOutputQuantization": ["MatMul"],
                             "UseQDQContribOps": options.activation_bits == 16}
    with tempfile.TemporaryDirectory() as tmp, _quiet_quantizer():
        cache = write_cache(ranges, Path(tmp) / "ranges.json")
        quantize_static(str(src), str(dst), None, quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["MatMul", "Gemm"], nodes_to_quantize=nodes,
                        per_channel=options.per_channel, reduce_range=options.reduce_range,
                        activation_type=(QuantType.QUInt16 if options.activation_bits == 16
                                         else QuantType.QInt8), weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, extra_options=extra,
                        calibration_cache_path=str(cache))


def _int4(model: onnx.ModelProto, dst: Path, nodes: list[str], options: QuantOptions) -> None:
    with _quiet_quantizer():  # the import configures logging
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if not nodes:
        raise ValueError("every linear layer is excluded: nothing to quantise")
    # nodes_to_include does not restrict (it is OR-ed with the op type), so exclude instead
    others = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in nodes]
    with _quiet_quantizer():
        quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=options.block_size,
                                         is_symmetric=True, accuracy_level=4,
                                         nodes_to_exclude=others, op_types_to_quantize=("MatMul",))
        quantizer.process()
    onnx.save(quantizer.model.model, str(dst))
