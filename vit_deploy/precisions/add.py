"""Add precisions to a bundle: quantise, measure against fp32, keep what passes.

Torch-free: the reference is the bundle's fp32 ONNX model, which the export already
checked against PyTorch under the fp32 policy.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from vit_deploy.runtime.files import link_or_copy
from vit_deploy.runtime.swap import staging_directory, writer_lock
from vit_deploy.atomic import atomic_directory
from vit_deploy.runtime.contract import ACCURACY_MAX_DROP, PRECISION_FILES, PRECISIONS, model_role, tolerance_class
from vit_deploy.parity import ParityReport
from vit_deploy.precisions.evaluate import PHOTO_BATCH, Evaluator, calibration_batches, ort_kernels
from vit_deploy.precisions.photos import EvalImages, PhotoCase, layer_costs
from vit_deploy.progress import Progress, silent
from vit_deploy.precisions.quantize import QuantOptions, quantisable_layers, quantize_model
from vit_deploy.precisions.fp16 import FP16_MAX, HEADROOM, PROBED_IMAGES, fp16_unsafe_nodes
from vit_deploy.precisions.search import RecipeSearch, search_notes
from vit_deploy.precisions.sensitivity import choose_exclusions, choose_smoothing
from vit_deploy.runtime.manifest import Manifest, load_manifest
from vit_deploy.runtime.manifest_parts import FileEntry

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
    photos: list[PhotoCase] = field(default_factory=list)  # on real images: the verdict
    judged_on: str = ""  # which real images
    layer_costs: list[dict[str, Any]] = field(default_factory=list)  # when photos failed

    @property
    def worst_photo(self) -> PhotoCase | None:
        return min(self.photos, key=lambda c: c.cosine_min) if self.photos else None

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "passed": self.passed, "recipe": self.recipe,
                "parity": self.parity.to_dict(), "accuracy": self.accuracy,
                "real_images": {"judged_on": self.judged_on,
                                "cases": [c.to_dict() for c in self.photos],
                                **({"layer_costs": self.layer_costs} if self.layer_costs
                                   else {})},
                "runtime": self.runtime, "notes": self.notes, "size": self.size}


@dataclass(frozen=True, kw_only=True)
class PrecisionOptions:
    quant: QuantOptions = QuantOptions()
    max_drop: float | None = None  # sensitivity budget (accuracy points, or 1 - cosine)
    force: bool = False  # write precisions that fail the policy
    # A labelled held-out set to measure top-1 accuracy on ("digits": the trained test
    # model's); None: judged by the logits alone.
    eval_set: str | None = None
    # The real images every precision is judged on (photos.resolve); None: the
    # photographs shipped with the package, held out from the default calibration set.
    eval_images: EvalImages | None = None
    calibration_source: str = "real photographs shipped with vit-deploy"
    # int8 / int8-static smoothing (smooth.py): "auto" tries SMOOTH_ALPHAS and keeps the
    # one that agrees best with fp32 on the calibration images; a number is that alpha;
    # None: no smoothing.
    smooth: str | float | None = "auto"

    def __post_init__(self) -> None:
        if self.eval_set is not None and self.eval_set not in EVAL_SETS:
            raise ValueError(f"evaluation set must be one of {list(EVAL_SETS)}, got "
                             f"{self.eval_set!r}")
        if not (self.smooth is None or self.smooth == "auto" or (
                isinstance(self.smooth, (int, float)) and not isinstance(self.smooth, bool)
                and 0.0 <= self.smooth <= 1.0)):
            raise ValueError(f"smoothing must be 'auto', none or an alpha within [0, 1], "
                             f"got {self.smooth!r}")


@dataclass
class PrecisionsReport:
    """What `add_precisions` measured, against the bundle's fp32 model."""

    results: list[PrecisionResult]
    fp32_size: int
    force: bool = False

    @property
    def failed(self) -> list[str]:
        return [r.precision for r in self.results if not r.passed]

    @property
    def passed(self) -> list[str]:
        return [r.precision for r in self.results if r.passed]

    @property
    def exit_code(self) -> int:
        """0: every precision passed (and was written); 1: none passed; 3: some passed and
        were written, the others failed (written only with --force)."""
        return 0 if not self.failed else 3 if self.passed else 1

    def __bool__(self) -> bool:
        return not self.failed

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __rich__(self) -> Any:
        from vit_deploy.precisions.table import precisions_table

        return precisions_table(self)


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
    if manifest.naflex:  # patches + mask + grids: judged by naflex.py
        return _add_naflex(bundle, manifest, precisions, options, log)
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"unknown precision(s) {unknown}; known: {list(PRECISIONS)}")
    wanted = [p for p in dict.fromkeys(precisions) if p != "fp32"]
    if not calibration and any(p.startswith("int8") for p in wanted):
        calibration = calibration_batches(manifest, None)  # the shipped photographs
    log("running the fp32 reference")
    evaluator = Evaluator(bundle, manifest, eval_set=options.eval_set,
                          images=options.eval_images)
    results: list[PrecisionResult] = []
    with staging_directory(bundle) as tmp:  # removed by the next opener if killed
        for precision in wanted:
            results.append(_one_precision(evaluator, precision, options, calibration,
                                          Path(tmp), log))
            r = results[-1]
            log("; ".join([f"{precision}: {'pass' if r.passed else 'FAIL'}",
                           *(n.strip() for n in r.notes if n.strip())]))
        return _write_passing(bundle, manifest, results, Path(tmp), options, log)


def _one_precision(evaluator: Evaluator, precision: str, options: PrecisionOptions,
                   calibration: Sequence[np.ndarray] | None, tmp: Path,
                   log: Progress) -> PrecisionResult:
    """One precision quantised, measured and judged. An int8 recipe search whose choice
    fails the verdict goes on (search.RecipeSearch.run) with its target raised over the
    chosen recipe's own expected figure by what the verdict found under the floor, while it
    has candidates and float budget left: never
    "target met" and then "FAIL, not written" with search budget left."""
    log(f"{precision}: quantising")
    quant = options.quant
    scores: dict[str, float] = {}
    searcher: RecipeSearch | None = None
    if precision.startswith("int8") and options.max_drop is None:
        searcher = RecipeSearch(evaluator, precision, quant, calibration, tmp,
                                smooth=options.smooth, progress=log)
        quant = searcher.run()
    elif precision.startswith("int8") and options.smooth is not None:
        quant, scores = choose_smoothing(evaluator, precision, quant, calibration,
                                         options.smooth, tmp, log)
    unsafe: dict[str, float] = {}
    if precision == "fp16":  # what leaves fp16's range on the photographs stays float32
        log(f"fp16: every tensor's range on {PROBED_IMAGES} photographs a size")
        unsafe = fp16_unsafe_nodes(evaluator.reference, evaluator.photo_inputs)
        quant = dataclasses.replace(quant, fp16_keep_nodes=tuple(unsafe))
        if unsafe:
            log(f"fp16: {len(unsafe)} node(s) kept float32: their tensors pass "
                f"{FP16_MAX / HEADROOM:.0f} on the photographs")
    ranking: list[dict[str, Any]] = []
    if options.max_drop is not None and precision != "fp16":
        quant, ranking = choose_exclusions(evaluator, precision, quant, calibration,
                                           options.max_drop, tmp, log)
    verdicts: list[dict[str, Any]] = []
    while True:
        dst = tmp / PRECISION_FILES[precision]
        q = quantize_model(evaluator.reference, dst, precision=precision, options=quant,
                           calibration=calibration, progress=log)
        if precision.startswith("int8"):
            q.recipe["calibration_source"] = options.calibration_source
        if scores:
            q.recipe.setdefault("smoothing", {"alpha": None})["chosen_on"] = {
                "images": int(sum(len(c) for c in calibration or [])),
                "metric": "worst per-image cosine to fp32 on the calibration images",
                "scores": scores}
        if searcher is not None:
            q.recipe["search"] = searcher.record | {"verdicts": verdicts}
            q.recipe.setdefault("smoothing", {"alpha": None})["chosen_by"] = "recipe search"
        if precision == "fp16":
            q.recipe["fp16_range"] = {
                "kept_fp32_nodes": unsafe, "limit": FP16_MAX / HEADROOM,
                "on": f"the first {PROBED_IMAGES} judged images at each size, every tensor"}
        if ranking:
            q.recipe["sensitivity"] = {"max_drop": options.max_drop, "metric":
                                       "accuracy points" if evaluator.digits is not None
                                       else "1 - cosine", "ranking": ranking}
        log(f"{precision}: judging on {evaluator.images.source}")
        result = _measure(evaluator, dst, precision, q.recipe)
        failing = [c for c in result.photos if not c.passed]
        if searcher is None or not failing:
            return result
        shortfall = max(c.floor - c.cosine_min for c in failing)
        verdicts.append({"worst": round(min(c.cosine_min for c in failing), 6),
                         "shortfall": round(shortfall, 6), "margin": searcher.margins[-1]})
        if not searcher.can_go_on:
            result.notes.append(f"the recipe search cannot go on after the failed verdict: "
                                f"{searcher.stopped or 'its candidates are spent'}")
            return result
        # the prediction for this recipe was off by at least the shortfall: the target
        # rises above this recipe's own expected figure by it, so the search must move
        chosen = searcher.best_score.expected if searcher.best_score else None
        floor = failing[0].floor
        margin = max(searcher.margins[-1] + shortfall,
                     (chosen - floor + shortfall) if chosen is not None else 0.0)
        log(f"{precision}: the verdict failed by {shortfall:.5f}: the search goes on, its "
            f"target raised to {margin:+.5f} over the floor")
        before = quant
        quant = searcher.run(margin)
        if quant == before:  # nothing better within the budget: this verdict stands
            result.recipe["search"] = searcher.record | {"verdicts": verdicts}
            result.notes.append(f"the recipe search went on after the failed verdict and "
                                f"found nothing better ({searcher.stopped or 'target met by the same recipe'})")
            return result


def _add_naflex(bundle: Path, manifest: Manifest, precisions: Sequence[str],
                options: PrecisionOptions, log: Progress) -> PrecisionsReport:
    from vit_deploy.precisions.naflex import JUDGED_ON, naflex_candidates

    with staging_directory(bundle) as tmp:
        results = [PrecisionResult(c.precision, c.path.name, c.passed, c.recipe, c.noise,
                                   photos=c.photos, judged_on=JUDGED_ON,
                                   size=c.path.stat().st_size)
                   for c in naflex_candidates(bundle, manifest, precisions, Path(tmp),
                                              quant=options.quant, progress=log)]
        return _write_passing(bundle, manifest, results, Path(tmp), options, log)


def _write_passing(bundle: Path, manifest: Manifest, results: list[PrecisionResult],
                   stage: Path, options: PrecisionOptions, log: Progress) -> PrecisionsReport:
    """The precisions that passed (every one with --force) written into the bundle from
    the staging folder; the report of all, any input kind (NCHW or NaFlex)."""
    keep = [r for r in results if r.passed or options.force]
    if keep:
        log(f"writing {', '.join(r.precision for r in keep)} into {bundle}")
        _rewrite(bundle, manifest, keep, stage)
    return PrecisionsReport(results, manifest.files[manifest.model_file("fp32")].size,
                            force=options.force)


def _measure(evaluator: Evaluator, path: Path, precision: str,
             recipe: dict[str, Any]) -> PrecisionResult:
    parity = evaluator.parity(path, precision)
    photos = evaluator.photos(path, precision)
    accuracy = evaluator.accuracy(path)
    notes: list[str] = []
    passed = bool(parity) and all(c.passed for c in photos)
    costs: list[dict[str, Any]] = []
    failing = [c for c in photos if not c.passed]
    if failing:
        notes.append(f"on {evaluator.images.source}: " + ", ".join(
            f"{c.label} worst image cosine {c.cosine_min:.5f} < {c.floor}"
            + (f" ({c.worst_image})" if c.worst_image else "") for c in failing))
        if recipe.get("quantised_layers"):
            layers = quantisable_layers(onnx.load(str(evaluator.reference),
                                                  load_external_data=False), head=True)
            costs = layer_costs(evaluator.reference, path,
                                evaluator.photo_inputs[0][:PHOTO_BATCH],
                                {p: n for p, n in layers.items()
                                 if p in recipe["quantised_layers"]})
        if costs:  # --exclude adds to the search's own choices: name both
            already = [p for p in recipe.get("kept_float_layers", []) if p != "head"]
            advice = ",".join(dict.fromkeys([*already, *(c["layer"] for c in costs)]))
            notes.append("layers that cost most (relative error each adds): " + ", ".join(
                f"{c['layer']} +{c['added_error']:.2%}" for c in costs)
                + f" (--exclude {advice}, or --max-drop)")
    if not parity:
        notes.append("outside the tolerance policy on seeded noise: " + ", ".join(
            f"{c.label} cosine {c.cosine:.5f} < {c.cosine_min}" for c in parity.failures))
    limit = ACCURACY_MAX_DROP.get(tolerance_class(precision))
    if accuracy is not None and limit is not None and accuracy["drop"] > limit:
        passed = False
        notes.append(f"held-out accuracy {accuracy['top1']}% is {accuracy['drop']} points under "
                     f"fp32 ({accuracy['fp32_top1']}%), over the {limit}-point limit")
    runtime = ort_kernels(path)
    notes += search_notes(evaluator, recipe, runtime)
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
        kept = recipe.get("fp16_range", {}).get("kept_fp32_nodes") or {}
        if kept:
            notes.append(f"kept float32, their tensors past {FP16_MAX / HEADROOM:.0f} on the "
                         f"photographs: {len(kept)} node(s) ("
                         + ", ".join(f"{n} {v:.3g}" for n, v in list(kept.items())[:4])
                         + (", ..." if len(kept) > 4 else "") + ")")
        inserted = runtime["inserted_casts"]
        notes.append(f"CPU provider: ONNX Runtime inserted {inserted} Cast nodes to run ops "
                     f"that have no fp16 CPU kernel in fp32 (fp16 is a GPU precision)"
                     if inserted else "CPU provider ran the fp16 graph without inserted casts")
    return PrecisionResult(precision, PRECISION_FILES[precision], passed, recipe, parity,
                           accuracy, runtime, notes, size=path.stat().st_size, photos=photos,
                           judged_on=evaluator.images.source, layer_costs=costs)


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
