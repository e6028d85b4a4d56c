"""Add precisions to a bundle: quantise, measure against fp32, keep what passes.

Torch-free: the reference is the bundle's fp32 ONNX model, which the export already
checked against PyTorch under the fp32 policy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from vit_deploy.atomic import atomic_directory
from vit_deploy.contract import (ACCURACY_MAX_DROP, MANIFEST_NAME, PRECISION_FILES, PRECISIONS)
from vit_deploy.quantize import QuantOptions, quantisable_layers, quantize_model
from vit_deploy.parity import ParityReport, judge, sample_inputs
from vit_deploy.runtime.manifest import file_entry, load_manifest
from vit_deploy.runtime.providers import captured_stderr
from vit_deploy.runtime.session import ViTSession

DIGITS_MODEL_NAME = "digits-vit"  # the trained test model: accuracy is measured on it
EXPECTED_KERNEL = {"int8": "DynamicQuantizeMatMul", "int4": "MatMulNBits"}


def policy_of(precision: str) -> str:
    """Tolerance class of a precision: int8-static is judged as int8."""
    return precision.split("-")[0]


@dataclass
class PrecisionResult:
    precision: str
    file: str
    passed: bool
    recipe: dict[str, Any]
    parity: ParityReport
    accuracy: dict[str, float] | None = None
    runtime: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "passed": self.passed, "recipe": self.recipe,
                "parity": self.parity.to_dict(), "accuracy": self.accuracy,
                "runtime": self.runtime, "notes": self.notes, "size": self.size}


@dataclass(frozen=True, kw_only=True)
class PrecisionOptions:
    quant: QuantOptions = QuantOptions()
    max_drop: float | None = None  # sensitivity budget (accuracy points, or 1 - cosine)
    force: bool = False  # write precisions that fail the policy


class Evaluator:
    """Measures a candidate model against the bundle's fp32 model."""

    def __init__(self, bundle: Path, manifest: dict[str, Any]):
        self.manifest = manifest
        cfg = manifest["config"]
        self.reference = bundle / manifest["models"]["fp32"]
        P = cfg["patch_size"]
        native = tuple(cfg["img_size"])
        deploy = tuple(manifest["preprocess"]["resolution"])
        if not manifest["io"]["dynamic"]:
            self.resolutions = [deploy]
        else:  # the native size and one other: the deploy size, else 1.5 × native
            other = deploy if deploy != native else (P * round(native[0] * 1.5 / P),
                                                     P * round(native[1] * 1.5 / P))
            self.resolutions = [native, other]
        self.inputs = [sample_inputs(hw, 2, channels=cfg["in_chans"], seed=11)
                       for hw in self.resolutions]
        with ViTSession(self.reference) as s:
            self.refs = [s.run(x) for x in self.inputs]
        self.digits = None
        if cfg.get("name") == DIGITS_MODEL_NAME:
            from vit_deploy.data import load_digits_split, normalise

            split = load_digits_split()
            self.digits = (normalise(split["test_images"]), split["test_labels"])
            with ViTSession(self.reference) as s:
                self.fp32_pred = s.run(self.digits[0]).argmax(1)

    def parity(self, path: Path, precision: str) -> ParityReport:
        with ViTSession(path) as s:
            cases = [judge(ref, s.run(x), resolution=hw, provider="cpu",
                           precision=policy_of(precision))
                     for hw, x, ref in zip(self.resolutions, self.inputs, self.refs)]
        return ParityReport(cases=cases)

    def accuracy(self, path: Path) -> dict[str, float] | None:
        if self.digits is None:
            return None
        x, y = self.digits
        with ViTSession(path) as s:
            pred = s.run(x).argmax(1)
        fp32 = float((self.fp32_pred == y).mean() * 100)
        acc = float((pred == y).mean() * 100)
        return {"top1": round(acc, 2), "fp32_top1": round(fp32, 2), "drop": round(fp32 - acc, 2),
                "agreement": round(float((pred == self.fp32_pred).mean() * 100), 2),
                "images": int(len(y))}

    def drop(self, path: Path, precision: str) -> float:
        """The sensitivity metric: accuracy points lost (trained model) or 1 - cosine."""
        acc = self.accuracy(path)
        if acc is not None:
            return acc["drop"]
        return 1.0 - min(c.cosine for c in self.parity(path, precision).cases)


def add_precisions(bundle: str | Path, precisions: Sequence[str], *,
                   options: PrecisionOptions = PrecisionOptions(),
                   calibration: Sequence[np.ndarray] | None = None,
                   log: Callable[[str], None] = lambda _: None) -> list[PrecisionResult]:
    """Quantise the bundle's fp32 model into each precision, measure, and rewrite the bundle
    atomically with those that pass (all of them with `force`)."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"unknown precision(s) {unknown}; known: {list(PRECISIONS)}")
    wanted = [p for p in dict.fromkeys(precisions) if p != "fp32"]
    if "int8-static" in wanted and not calibration:
        raise ValueError("int8-static needs calibration images: --calib DIR "
                         "(or --calib digits for the trained test model)")
    evaluator = Evaluator(bundle, manifest)
    results: list[PrecisionResult] = []
    with tempfile.TemporaryDirectory(dir=bundle.parent, prefix=f".{bundle.name}.q-") as tmp:
        for precision in wanted:
            log(f"{precision}: quantising")
            quant = options.quant
            ranking: list[dict[str, Any]] = []
            if options.max_drop is not None and precision != "fp16":
                quant, ranking = choose_exclusions(evaluator, precision, quant, calibration,
                                                   options.max_drop, Path(tmp), log)
            dst = Path(tmp) / PRECISION_FILES[precision]
            q = quantize_model(evaluator.reference, dst, precision=precision, options=quant,
                               calibration=calibration)
            if ranking:
                q.recipe["sensitivity"] = {"max_drop": options.max_drop, "metric":
                                           "accuracy points" if evaluator.digits is not None
                                           else "1 - cosine", "ranking": ranking}
            results.append(_measure(evaluator, dst, precision, q.recipe))
            r = results[-1]
            log(f"{precision}: {'pass' if r.passed else 'FAIL'}; " + "; ".join(r.notes))
        keep = [r for r in results if r.passed or options.force]
        if keep:
            _rewrite(bundle, manifest, keep, Path(tmp))
    return results


def choose_exclusions(evaluator: Evaluator, precision: str, quant: QuantOptions,
                      calibration: Sequence[np.ndarray] | None, max_drop: float, tmp: Path,
                      log: Callable[[str], None]) -> tuple[QuantOptions, list[dict[str, Any]]]:
    """Keep the most sensitive linear layers in float until the drop is within budget."""
    def drop_with(exclude: tuple[str, ...]) -> float:
        path = tmp / f"probe.{precision}.onnx"
        quantize_model(evaluator.reference, path, precision=precision, calibration=calibration,
                       options=QuantOptions(**{**quant.__dict__, "exclude": exclude}))
        return evaluator.drop(path, precision)

    base = tuple(quant.exclude)
    total = drop_with(base)
    if total <= max_drop:
        return quant, [{"layer": "(all quantised)", "drop": round(total, 6), "kept_float": False}]
    model = onnx.load(str(evaluator.reference), load_external_data=False)
    layers = [p for p in quantisable_layers(model, head=quant.head) if p not in base]
    alone = {}
    for layer in layers:  # quantise one layer at a time: the error it adds on its own
        alone[layer] = drop_with(tuple(p for p in layers if p != layer) + base)
    ranked = sorted(layers, key=lambda p: -alone[p])
    excluded = list(base)
    ranking = []
    for layer in ranked:
        if total <= max_drop:
            break
        if len(excluded) == len(base) + len(layers) - 1:
            raise ValueError(f"--max-drop {max_drop} cannot be met for {precision}: with only "
                             f"{layer} quantised the drop is still {total:.4g}")
        excluded.append(layer)
        total = drop_with(tuple(excluded))
        ranking.append({"layer": layer, "drop_alone": round(alone[layer], 6), "kept_float": True,
                        "drop_after": round(total, 6)})
        log(f"{precision}: keeping {layer} in float (alone it costs {alone[layer]:.4g}); "
            f"now {total:.4g}")
    ranking += [{"layer": p, "drop_alone": round(alone[p], 6), "kept_float": False}
                for p in ranked if p not in excluded]
    return QuantOptions(**{**quant.__dict__, "exclude": tuple(excluded)}), ranking


def _measure(evaluator: Evaluator, path: Path, precision: str,
             recipe: dict[str, Any]) -> PrecisionResult:
    parity = evaluator.parity(path, precision)
    accuracy = evaluator.accuracy(path)
    notes: list[str] = []
    passed = bool(parity)
    if not parity:
        notes.append("logits outside the tolerance policy: " + ", ".join(
            f"{c.label} cosine {c.cosine:.5f} < {c.cosine_min}" for c in parity.failures))
    limit = ACCURACY_MAX_DROP.get(policy_of(precision))
    if accuracy is not None and limit is not None and accuracy["drop"] > limit:
        passed = False
        notes.append(f"held-out accuracy {accuracy['top1']}% is {accuracy['drop']} points under "
                     f"fp32 ({accuracy['fp32_top1']}%), over the {limit}-point limit")
    runtime = ort_kernels(path)
    expected = EXPECTED_KERNEL.get(precision)
    n_quant = len(recipe.get("quantised_layers", []))
    if expected:
        got = runtime["optimised_ops"].get(expected, 0)
        runtime["check"] = f"{got} {expected} for {n_quant} quantised layers"
        if got != n_quant:
            passed = False
            notes.append(f"ONNX Runtime runs {got} {expected} kernels for {n_quant} quantised "
                         f"layers: some stayed float")
    if precision == "fp16":
        inserted = runtime["inserted_casts"]
        notes.append(f"CPU provider: ONNX Runtime inserted {inserted} Cast nodes to run ops "
                     f"that have no fp16 CPU kernel in fp32 (fp16 is a GPU precision)"
                     if inserted else "CPU provider ran the fp16 graph without inserted casts")
    return PrecisionResult(precision, PRECISION_FILES[precision], passed, recipe, parity,
                           accuracy, runtime, notes, size=path.stat().st_size)


def ort_kernels(path: Path) -> dict[str, Any]:
    """What ONNX Runtime's CPU provider makes of the file: op counts after its own
    optimisation, and how many Cast nodes it had to insert."""
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        with captured_stderr():  # ORT warns that NCHWc graphs are machine-specific: we know
            ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        optimised = onnx.load(so.optimized_model_filepath)
    source = onnx.load(str(path))
    ops: dict[str, int] = {}
    for n in optimised.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    casts = sum(n.op_type == "Cast" for n in source.graph.node)
    return {"provider": "cpu", "optimised_ops": dict(sorted(ops.items())),
            "inserted_casts": max(0, ops.get("Cast", 0) - casts)}


def _rewrite(bundle: Path, manifest: dict[str, Any], results: list[PrecisionResult],
             staged: Path) -> None:
    with atomic_directory(bundle) as tmp:
        for name in manifest["files"]:  # hard links: a multi-GB bundle is not copied
            _link_or_copy(bundle / name, tmp / name)
        precisions = dict(manifest.get("precisions", {}))
        for r in results:
            shutil.move(str(staged / r.file), tmp / r.file)
            manifest["models"][r.precision] = r.file
            manifest["files"][r.file] = file_entry(tmp / r.file) | {"role": f"model:{r.precision}"}
            precisions[r.precision] = r.to_dict()
        manifest["precisions"] = precisions
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")


def calibration_batches(manifest: dict[str, Any], source: str | Path, *, limit: int = 64,
                        batch: int = 8) -> list[np.ndarray]:
    """Calibration inputs, preprocessed as the manifest says: a folder of images, or
    'digits' (the trained test model's training split, shipped with the package)."""
    from vit_deploy.runtime.preprocess import Preprocess

    pre = Preprocess.from_manifest(manifest, resize="shorter_side_center_crop")
    if str(source) == "digits":
        from vit_deploy.data import load_digits_split

        images: list[Any] = list(load_digits_split()["train_images"][:limit])
    else:
        folder = Path(source)
        if not folder.is_dir():
            raise ValueError(f"--calib must be a folder of images or 'digits', got {str(folder)!r}")
        images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)[:limit]
        if not images:
            raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {str(folder)!r}")
    x = np.stack([pre(image) for image in images])
    return [x[i:i + batch] for i in range(0, len(x), batch)]
