"""`vit-deploy target`: fixed-shape graphs per resolution bucket for an edge target.

    vit-deploy target BUNDLE --target mobile --buckets 224,256x320,448 [--batch 1]

For each bucket, a static graph (export/static.py: position table folded, no Resize, no
Shape, fixed batch) for each precision the target needs, each checked against PyTorch
(rebuilt from the bundle's weights) at exactly its size by the tolerance policy; a graph
that fails is not written. Then, per target:

| target | precisions | also |
|---|---|---|
| cpu | fp32 (+ int8 if the bundle has it) | |
| mobile | fp32 (+ int8 if the bundle has it) | ORT format (.ort + required_operators.config), ORT's mobile checker |
| web | fp32 (+ int8 if the bundle has it) | ORT format |
| npu | int8-static (QDQ, calibrated as `quantize` does) | ORT's mobile checker (NNAPI); Qualcomm HTP (targets/htp.py) |
| tensorrt | fp32, fp16 | TensorRT options (runtime/tensorrt.py) recorded |

The bundle is rewritten atomically under its writer lock (files it does not list are
kept); adding a target again replaces that target's files.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from vit_deploy.runtime.files import link_or_copy
from vit_deploy.runtime.swap import staging_directory, writer_lock
from vit_deploy.atomic import atomic_directory
from vit_deploy.runtime.contract import BUCKET_POLICIES, TARGETS, TARGETS_DIR
from vit_deploy.targets.ort_tools import ORT_FORMAT_LEVEL, _to_ort, mobile_check
from vit_deploy.outputs import OutputSelection
from vit_deploy.parity import ParityReport, batch_independence, compare, sample_inputs
from vit_deploy.progress import Progress, silent
from vit_deploy.precisions.quantize import QuantOptions, linear_layers, quantize_model
from vit_deploy.runtime.manifest import Manifest, load_manifest
from vit_deploy.runtime.manifest_parts import BucketGraph, FileEntry, TargetSpec
from vit_deploy.runtime.ort_session import RuntimeOptions
from vit_deploy.runtime.session import ViTSession
from vit_deploy.runtime.sizes import format_resolution, guard_memory, require_patch_multiple
from vit_deploy.targets.report import GraphResult, TargetReport

# (precisions always built, precisions built when the bundle has them)
TARGET_PRECISIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cpu": (("fp32",), ("int8",)),
    "mobile": (("fp32",), ("int8",)),
    "web": (("fp32",), ("int8",)),
    "npu": (("int8-static",), ()),
    "tensorrt": (("fp32", "fp16"), ()),
}
MOBILE_CHECK = ("mobile", "npu")  # targets whose graphs ORT's mobile checker judges
# Targets whose graphs write LayerNorm and GELU in the ops NNAPI and CoreML take (export/
# static.py). Not npu: HTP takes LayerNormalization and Erf, and runs float ops in fp16, where
# the decomposed LayerNorm's squares overflow on DINOv2-S's large activations (measured:
# cosine 0.82 to PyTorch against 0.998 native, docs/edge-targets.md).
MOBILE_OPS = ("mobile",)
# The npu graphs' int8 weights per channel, as every int8 file of ours, on linear layers
# written as 2-D Gemms (export/static.py: linears_as_gemm): Qualcomm's HTP takes per-channel
# weights on a Gemm, not on a MatMul (their DequantizeLinear ran on the CPU: targets/htp.py
# names such nodes). Per tensor, every MatMul ran on HTP, but the trained DINOv2-S's worst
# real photograph fell from cosine 0.998 to 0.971 (docs/edge-targets.md): a measured lever.
NPU_WEIGHTS_PER_CHANNEL = True
PARITY_SEED = 7
MAX_BUCKETS = 16


@dataclass(frozen=True, kw_only=True)
class TargetOptions:
    target: str
    buckets: tuple[tuple[int, int], ...]
    batch: int = 1
    policy: str = "aspect-then-area"
    calibration: str | None = None  # int8-static: a folder of images, or 'digits'
    calibration_samples: int = 64
    activation_bits: int = 8  # npu: 16 for w8a16 (uint16 activations, int8 weights)

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {list(TARGETS)}, got {self.target!r}")
        if self.activation_bits not in (8, 16) or (self.activation_bits == 16
                                                   and self.target != "npu"):
            raise ValueError(f"activation bits: 8, or 16 for the npu target's int8-static "
                             f"graphs (w8a16), got {self.activation_bits!r} for target "
                             f"{self.target}")
        if not self.buckets or len(self.buckets) > MAX_BUCKETS:
            raise ValueError(f"give 1 to {MAX_BUCKETS} buckets, got {len(self.buckets)}")
        if len(set(self.buckets)) != len(self.buckets):
            raise ValueError(f"buckets must differ, got {[format_resolution(b) for b in self.buckets]}")
        if not 1 <= self.batch <= 64:
            raise ValueError(f"batch must be 1..64, got {self.batch}")
        if self.policy not in BUCKET_POLICIES:
            raise ValueError(f"policy must be one of {list(BUCKET_POLICIES)}, got {self.policy!r}")


def add_target(bundle: str | Path, options: TargetOptions, *,
               progress: Progress = silent) -> TargetReport:
    """Build, check and write `options.target`'s graphs into `bundle` (see module doc)."""
    with writer_lock(bundle):
        return _add_target(Path(bundle), options, progress)


def _add_target(bundle: Path, options: TargetOptions, log: Progress) -> TargetReport:
    from vit_deploy.export.checkpoints import load_model
    from vit_deploy.export.model import numpy_forward
    from vit_deploy.export.static import export_static

    manifest = load_manifest(bundle)
    manifest.require_nchw("vit-deploy target")
    cfg = manifest.config
    for hw in options.buckets:
        require_patch_multiple(*hw, cfg.patch_size)
        guard_memory(*hw, cfg, batch=options.batch)
    if manifest.weights_file is None:
        raise ValueError(f"bundle {str(bundle)!r} holds no PyTorch weights to build and check "
                         f"static graphs from")
    always, optional = TARGET_PRECISIONS[options.target]
    absent = [p for p in always if p not in manifest.models]
    if absent:  # the runtime keeps the dynamic graph of each precision for other sizes
        raise ValueError(f"target {options.target} builds {list(always)} graphs and needs the "
                         f"bundle's own {absent} model(s) beside them (the dynamic graph for "
                         f"sizes that are not a bucket): vit-deploy quantize BUNDLE --precision "
                         f"{','.join(absent)} first")
    precisions = [*always, *(p for p in optional if p in manifest.models)]
    if "int8-static" in precisions and not options.calibration:
        raise ValueError(f"target {options.target} builds int8-static (QDQ) graphs, which need "
                         f"calibration images: --calib DIR (or --calib digits)")
    log("rebuilding the PyTorch model from the bundle's weights")
    model = load_model(manifest.resolve(bundle, manifest.weights_file))
    outputs = tuple(manifest.io.output_names)
    reference = numpy_forward(_reference_module(model, outputs, manifest))
    folder = f"{TARGETS_DIR}/{options.target}"
    results: list[GraphResult] = []
    record: dict[str, Any] = {"policy_doc": "nearest aspect ratio (log H/W), then the smallest "
                              "bucket at least the image's area (else the largest); resize to "
                              "cover and centre-crop", "precisions": precisions}
    if options.calibration:  # what targets/htp.py judges on: held-out images of that kind
        record["calibrated_on"] = "digits" if options.calibration == "digits" else "images"
    with staging_directory(bundle) as tmp:  # removed by the next opener if killed
        stage = Path(tmp)
        (stage / folder).mkdir(parents=True)
        for hw in options.buckets:
            x = sample_inputs(hw, options.batch, channels=cfg.in_chans, seed=PARITY_SEED)
            refs = [reference(x)]
            stem = f"{folder}/{hw[0]}x{hw[1]}.b{options.batch}"
            fp32 = stage / f"{stem}.fp32.onnx"
            log(f"{format_resolution(hw)}: static export (batch {options.batch})")
            export_static(model, fp32, batch=options.batch, resolution=hw, outputs=outputs,
                          layer_norm=manifest.io.layer_norm,
                          mobile_ops=options.target in MOBILE_OPS,
                          linear_as_gemm=options.target == "npu")
            for precision in precisions:
                name = f"{stem}.{precision}.onnx"
                if precision != "fp32":
                    log(f"{format_resolution(hw)}: {precision}")
                    quant = _quant_options(manifest, precision, fp32)
                    if options.target == "npu":
                        record["linear_layers"] = "Gemm (2-D), as HTP takes per-channel weights"
                        quant = replace(quant, activation_bits=options.activation_bits)
                        record["activations"] = {8: "int8 (w8a8)", 16: "uint16 (w8a16)"}[
                            options.activation_bits]
                    if options.target == "npu" and not NPU_WEIGHTS_PER_CHANNEL:
                        quant = replace(quant, per_channel=False)
                        record["weights"] = "int8 per tensor (HTP's MatMul: targets/htp.py)"
                    calib = (_calibration(manifest, options, hw) if precision == "int8-static"
                             or quant.smooth is not None else None)
                    record.setdefault("int8_cpu", {})[precision] = quant.cpu
                    if quant.smooth is not None:
                        record.setdefault("smoothing", {})[precision] = quant.smooth
                    quantize_model(fp32, stage / name, precision=precision, options=quant,
                                   calibration=calib)
                log(f"{format_resolution(hw)} {precision}: parity against PyTorch")
                results.append(_measure(stage, name, hw, precision, x, refs, options.batch))
            if "fp32" not in precisions:
                fp32.unlink()
        passing = [r for r in results if r.passed]
        for r in results:
            if not r.passed:
                (stage / r.file).unlink(missing_ok=True)
        ops_file = None
        if options.target in ORT_FORMAT_LEVEL and passing:
            log("converting to ORT format (onnxruntime.tools.convert_onnx_models_to_ort)")
            ops_file, record["ort_format"] = _to_ort(stage, folder, passing, options.target)
            for r in passing:
                x = sample_inputs(r.resolution, options.batch, channels=cfg.in_chans,
                                  seed=PARITY_SEED)
                r.ort_parity = _parity(stage / r.ort_file, r.precision, x, [reference(x)],
                                       options.batch)
                if not r.ort_parity:
                    r.notes.append("the .ort file fails parity: the graph is not written")
            for r in passing:
                if not r.passed:
                    for f in (r.file, r.ort_file):
                        (stage / f).unlink(missing_ok=True)
            passing = [r for r in passing if r.passed]
            if not passing and ops_file:
                (stage / ops_file).unlink(missing_ok=True)
                ops_file = None
        if options.target in MOBILE_CHECK and passing:
            log("ORT's mobile usability checker")
            first = {}
            for r in passing:
                first.setdefault(r.precision, r)
            record["mobile_check"] = {
                "dynamic graph (model.onnx, as exported)": mobile_check(
                    manifest.model_path(bundle, "fp32")),
                **{f"static {format_resolution(r.resolution)} b{options.batch} {r.precision}":
                   mobile_check(stage / r.file) for r in first.values()}}
        record["graphs"] = [r.to_dict() for r in results]
        ref_cases = _bucket_references(bundle, manifest, options.target, reference,
                                       sorted({r.resolution for r in passing}), record)
        if passing:
            spec = TargetSpec(name=options.target, batch=options.batch, policy=options.policy,
                              graphs=tuple(BucketGraph(resolution=r.resolution, batch=options.batch,
                                                       precision=r.precision, file=r.file,
                                                       ort_file=r.ort_file) for r in passing),
                              required_operators=ops_file, record=record)
            log(f"writing target {options.target} into {bundle}")
            rewrite_target(bundle, manifest, spec, stage, ref_cases)
    return TargetReport(str(bundle), options.target, options.batch, results, record)


def _reference_module(model: Any, outputs: tuple[str, ...], manifest: Manifest) -> Any:
    """The PyTorch module whose outputs the bundle's graphs carry, in their order."""
    from vit_deploy.export.model import reference_model

    return reference_model(model, OutputSelection(names=outputs,
                                                  layer_norm=manifest.io.layer_norm))


def _quant_options(manifest: Manifest, precision: str, fp32: Path) -> QuantOptions:
    """The bundle's own recipe for `precision`, so a bucket graph is quantised as the
    dynamic one was (`QuantOptions.following`: never less portable than stated)."""
    layers = linear_layers(onnx.load(str(fp32), load_external_data=False))
    return QuantOptions.following(manifest.int8_recipe(precision), layers)


def _calibration(manifest: Manifest, options: TargetOptions,
                 hw: tuple[int, int]) -> list[np.ndarray]:
    """Calibration batches at the bucket's size and fixed batch (a partial one dropped)."""
    from vit_deploy.precisions.evaluate import calibration_batches

    batches = calibration_batches(manifest, options.calibration, resolutions=[hw],
                                  limit=options.calibration_samples, batch=options.batch)
    full = [b for b in batches if len(b) == options.batch]
    if not full:
        raise ValueError(f"--calib gave {sum(len(b) for b in batches)} image(s), fewer than one "
                         f"batch of {options.batch}")
    return full


def _parity(path: Path, precision: str, x: np.ndarray, refs: list[Any],
            batch: int) -> ParityReport:
    with ViTSession(path, options=RuntimeOptions(verify=False), target=None) as s:
        cases = compare(s.run_all, refs, [x], precision=precision, provider="cpu")
        checks = ([batch_independence(s.run_all, tuple(x.shape[2:]), batch=batch,
                                      subject=f"onnxruntime:cpu:{precision}",
                                      channels=x.shape[1])] if batch > 1 else [])
    return ParityReport(cases=cases, checks=checks)


def _measure(stage: Path, name: str, hw: tuple[int, int], precision: str, x: np.ndarray,
             refs: list[Any], batch: int) -> GraphResult:
    path = stage / name
    nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
    result = GraphResult(hw, precision, name, _parity(path, precision, x, refs, batch), nodes)
    if not result.parity:
        result.notes.append("outside the tolerance policy: " + ", ".join(
            f"{c.label} cosine {c.cosine:.6f}, max|Δ| {c.max_abs:.2e}"
            for c in result.parity.cases if not c.passed))
    return result


def _bucket_references(bundle: Path, manifest: Manifest, target: str, reference: Any,
                       sizes: list[tuple[int, int]], record: dict[str, Any]) -> list | None:
    """PyTorch's outputs at each bucket size (batch 2) as golden reference cases of this
    target, beside the bundle's own (within the same bound); None for a bundle without
    references (exported before them: its check needs torch anyway)."""
    from vit_deploy.export.references import budget, golden_references

    if manifest.references is None:
        return None
    kept = manifest.references.without_target(target)
    cases, notes = golden_references(
        reference, [(f"{target} {format_resolution(hw)}", hw) for hw in sizes],
        channels=manifest.config.in_chans, output_names=manifest.io.output_names,
        budget_bytes=budget(manifest.files[manifest.model_file("fp32")].size),
        used_bytes=kept.nbytes, target=target)
    if notes:
        record["reference_notes"] = notes
    return cases


def rewrite_target(bundle: Path, manifest: Manifest, spec: TargetSpec, stage: Path,
             ref_cases: list | None = None) -> None:
    """The bundle with `spec` swapped in atomically: the files the manifest lists are
    linked over (an older version of this target's files dropped), the new ones moved in;
    with `ref_cases`, the references file is rewritten with them in place of the target's
    earlier cases."""
    old = set(manifest.targets[spec.name].files()) if spec.name in manifest.targets else set()
    with atomic_directory(bundle) as tmp:
        for name in manifest.files:
            if name not in old:
                link_or_copy(bundle / name, tmp / name)
        entries = {}
        for name in spec.files():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(stage / name), tmp / name)
            role = "target:" + spec.name + (":required-operators" if name == spec.required_operators
                                            else "")
            entries[name] = FileEntry.of(tmp / name, role)
        manifest = manifest.with_target(spec, entries)
        if ref_cases is not None and manifest.references is not None:
            manifest = _with_bucket_references(bundle, manifest, spec.name, ref_cases, tmp)
        manifest.save(tmp)


def _with_bucket_references(bundle: Path, manifest: Manifest, target: str, ref_cases: list,
                            tmp: Path) -> Manifest:
    from vit_deploy.runtime.references import REFERENCES_ROLE, pack, read_outputs, read_pixels

    old = manifest.references
    kept = old.without_target(target)
    path = manifest.resolve(bundle, old.file)
    cases = [*zip(kept.cases, read_outputs(path, kept)), *ref_cases]
    refs, data = pack(cases, source=old.source, file=old.file, pixels=read_pixels(path, kept))
    (tmp / old.file).unlink(missing_ok=True)  # a link to the live bundle's file: never write it
    (tmp / old.file).write_bytes(data)
    return manifest.with_references(refs, FileEntry.of(tmp / old.file, REFERENCES_ROLE))


def parse_buckets(text: str) -> tuple[tuple[int, int], ...]:
    """'224,256x320,448' -> ((224, 224), (256, 320), (448, 448))."""
    from vit_deploy.runtime.sizes import parse_resolution

    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise ValueError(f"expected buckets like 224,256x320,448, got {text!r}")
    return tuple(parse_resolution(v) for v in items)


__all__ = ["TargetOptions", "add_target", "parse_buckets"]
