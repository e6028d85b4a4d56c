"""Add precisions to a bundle: quantise, measure against fp32, keep what passes.

Torch-free: the reference is the bundle's fp32 ONNX model, which the export already
checked against PyTorch under the fp32 policy.
"""

from __future__ import annotations

import dataclasses
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

from vit_deploy.runtime.files import link_or_copy
from vit_deploy.runtime.swap import staging_directory, writer_lock
from vit_deploy.atomic import atomic_directory
from vit_deploy.runtime.contract import ACCURACY_MAX_DROP, PRECISION_FILES, PRECISIONS, model_role, tolerance_class
from vit_deploy.parity import ParityReport, compare, sample_inputs
from vit_deploy.progress import Progress, silent
from vit_deploy.quantize import QuantOptions, quantisable_layers, quantize_model
from vit_deploy.runtime.manifest import Manifest, load_manifest
from vit_deploy.runtime.manifest_parts import FileEntry
from vit_deploy.runtime.providers import captured_stderr
from vit_deploy.runtime.session import ViTSession

# The kernels ONNX Runtime's CPU provider must run, one per quantised layer (else some
# layer silently stayed float: for QDQ, DequantizeLinear of the weight + an fp32 MatMul)
EXPECTED_KERNELS = {"int8": ("DynamicQuantizeMatMul",), "int4": ("MatMulNBits",),
                    "int8-static": ("MatMulIntegerToFloat", "QLinearMatMul", "QGemm")}
EVAL_SETS = ("digits",)  # labelled held-out sets shipped with the package


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
    # A labelled held-out set to measure top-1 accuracy on ("digits": the trained test
    # model's); None: judged by the logits alone.
    eval_set: str | None = None

    def __post_init__(self) -> None:
        if self.eval_set is not None and self.eval_set not in EVAL_SETS:
            raise ValueError(f"evaluation set must be one of {list(EVAL_SETS)}, got "
                             f"{self.eval_set!r}")


@dataclass
class PrecisionsReport:
    """What `add_precisions` measured, against the bundle's fp32 model."""

    results: list[PrecisionResult]
    fp32_size: int
    force: bool = False

    @property
    def failed(self) -> list[str]:
        return [r.precision for r in self.results if not r.passed]

    def __bool__(self) -> bool:
        return not self.failed

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.filesize import decimal
        from rich.table import Table

        table = Table("precision", "file", "size", "cosine (min)", "max|Δ|", "accuracy",
                      "result", title="precisions vs fp32", title_justify="left")
        for r in self.results:
            acc = r.accuracy
            table.add_row(r.precision, r.file,
                          f"{decimal(r.size)} ({r.size / max(1, self.fp32_size):.1%})",
                          f"{min(c.cosine for c in r.parity.cases):.5f}",
                          f"{max(c.max_abs for c in r.parity.cases):.2e}",
                          f"{acc['top1']}% (fp32 {acc['fp32_top1']}%)" if acc else "-",
                          "ok" if r.passed else ("FAIL, written (--force)" if self.force else
                                                 "FAIL, not written"))
        lines: list[Any] = [table]
        for r in self.results:
            lines += [f"{r.precision}: {note}" for note in r.notes]
            if r.recipe.get("sensitivity"):
                kept = [x["layer"] for x in r.recipe["sensitivity"]["ranking"]
                        if x.get("kept_float")]
                lines.append(f"{r.precision}: kept float by sensitivity: {kept or 'none'}")
        if self.failed:
            lines.append(f"[red]{', '.join(self.failed)} failed the tolerance policy"
                         f"{' (written anyway: --force)' if self.force else ' and were not written'}[/]")
        return Group(*lines)


class Evaluator:
    """Measures a candidate model against the bundle's fp32 model."""

    def __init__(self, bundle: Path, manifest: Manifest, *, eval_set: str | None = None):
        self.manifest = manifest
        cfg = manifest.config
        self.reference = manifest.model_path(bundle, "fp32")
        P = cfg.patch_size
        native = cfg.img_size
        deploy = manifest.deploy_resolution
        if not manifest.io.dynamic:
            self.resolutions = [deploy]
        else:  # the native size and one other: the deploy size, else 1.5 × native
            other = deploy if deploy != native else (P * round(native[0] * 1.5 / P),
                                                     P * round(native[1] * 1.5 / P))
            self.resolutions = [native, other]
        self.inputs = [sample_inputs(hw, 2, channels=cfg.in_chans, seed=11)
                       for hw in self.resolutions]
        self.digits = None
        if eval_set == "digits":
            from vit_deploy.data import load_digits_split, normalise

            split = load_digits_split()
            self.digits = (normalise(split["test_images"]), split["test_labels"])
        with ViTSession(self.reference) as s:  # one fp32 session for every reference
            self.refs = [s.run_all(x) for x in self.inputs]  # every output is judged
            if self.digits is not None:
                self.fp32_pred = s.run(self.digits[0]).argmax(1)

    def parity(self, path: Path, precision: str) -> ParityReport:
        with ViTSession(path) as s:
            return ParityReport(cases=compare(s.run_all, self.refs, self.inputs,
                                              precision=precision, provider="cpu"))

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
                   progress: Progress = silent) -> PrecisionsReport:
    """Quantise the bundle's fp32 model into each precision, measure, and rewrite the bundle
    atomically with those that pass (all of them with `force`). The bundle is locked from
    the first read to the swap: a second writer fails instead of losing a precision."""
    with writer_lock(bundle):
        return _add_precisions(Path(bundle), precisions, options=options,
                               calibration=calibration, log=progress)


def _add_precisions(bundle: Path, precisions: Sequence[str], *, options: PrecisionOptions,
                    calibration: Sequence[np.ndarray] | None,
                    log: Progress) -> PrecisionsReport:
    manifest = load_manifest(bundle)
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"unknown precision(s) {unknown}; known: {list(PRECISIONS)}")
    wanted = [p for p in dict.fromkeys(precisions) if p != "fp32"]
    if "int8-static" in wanted and not calibration:
        raise ValueError("int8-static needs calibration images: --calib DIR "
                         "(or --calib digits for the trained test model)")
    log("running the fp32 reference")
    evaluator = Evaluator(bundle, manifest, eval_set=options.eval_set)
    results: list[PrecisionResult] = []
    with staging_directory(bundle) as tmp:  # removed by the next opener if killed
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
            log(f"writing {', '.join(r.precision for r in keep)} into {bundle}")
            _rewrite(bundle, manifest, keep, Path(tmp))
    return PrecisionsReport(results, manifest.files[manifest.model_file("fp32")].size,
                            force=options.force)


def choose_exclusions(evaluator: Evaluator, precision: str, quant: QuantOptions,
                      calibration: Sequence[np.ndarray] | None, max_drop: float, tmp: Path,
                      log: Callable[[str], None]) -> tuple[QuantOptions, list[dict[str, Any]]]:
    """Keep the most sensitive linear layers in float until the drop is within budget."""
    def drop_with(exclude: tuple[str, ...]) -> float:
        path = tmp / f"probe.{precision}.onnx"
        quantize_model(evaluator.reference, path, precision=precision, calibration=calibration,
                       options=dataclasses.replace(quant, exclude=exclude))
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
    return dataclasses.replace(quant, exclude=tuple(excluded)), ranking


def _measure(evaluator: Evaluator, path: Path, precision: str,
             recipe: dict[str, Any]) -> PrecisionResult:
    parity = evaluator.parity(path, precision)
    accuracy = evaluator.accuracy(path)
    notes: list[str] = []
    passed = bool(parity)
    if not parity:
        notes.append("logits outside the tolerance policy: " + ", ".join(
            f"{c.label} cosine {c.cosine:.5f} < {c.cosine_min}" for c in parity.failures))
    limit = ACCURACY_MAX_DROP.get(tolerance_class(precision))
    if accuracy is not None and limit is not None and accuracy["drop"] > limit:
        passed = False
        notes.append(f"held-out accuracy {accuracy['top1']}% is {accuracy['drop']} points under "
                     f"fp32 ({accuracy['fp32_top1']}%), over the {limit}-point limit")
    runtime = ort_kernels(path)
    kernels = EXPECTED_KERNELS.get(precision)
    n_quant = len(recipe.get("quantised_layers", []))
    if kernels:
        got = sum(runtime["optimised_ops"].get(k, 0) for k in kernels)
        expected = " / ".join(kernels)
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


def _rewrite(bundle: Path, manifest: Manifest, results: list[PrecisionResult],
             staged: Path) -> None:
    """The bundle with the new precisions, swapped in atomically. Only files the manifest
    lists are ours to replace; everything else in the bundle is carried over."""
    with atomic_directory(bundle) as tmp:
        for name in manifest.files:
            if name not in {r.file for r in results}:  # hard links: nothing is copied
                link_or_copy(bundle / name, tmp / name)
        for r in results:
            shutil.move(str(staged / r.file), tmp / r.file)
            manifest = manifest.with_precision(r.precision, r.file,
                                               FileEntry.of(tmp / r.file, model_role(r.precision)),
                                               r.to_dict())
        manifest.save(tmp)


def image_suffixes() -> set[str]:
    """File suffixes Pillow can open here (its own registry)."""
    from PIL import Image

    return {ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN}


def calibration_batches(manifest: Manifest, source: str | Path, *, limit: int = 64,
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
        suffixes = image_suffixes()
        images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in suffixes)[:limit]
        if not images:
            raise ValueError(f"no images (files Pillow opens: .png, .jpg, .webp, ...) in "
                             f"{str(folder)!r}")
    x = np.stack([pre(image) for image in images])
    return [x[i:i + batch] for i in range(0, len(x), batch)]

