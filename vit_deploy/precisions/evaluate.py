"""Measuring a candidate precision against the bundle's fp32 model, and the inputs it is
calibrated on: real images (the verdict), seeded noise (beside them), the digits where
asked, at every size the bundle is judged at. Torch-free.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from vit_deploy.parity import ParityReport, compare, sample_inputs
from vit_deploy.precisions.photos import (VIEW_BOX, EvalImages, PhotoCase, digits_images,
                                          judge_photos, resolve)
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.providers import captured_stderr
from vit_deploy.runtime.session import ViTSession

FRAMINGS = 1 + len(VIEW_BOX)  # views of one calibration photograph: whole and its crops
# The search's expected worst: at 95 % (the report's), ten scored photographs' spread put
# the trained DINOv2-S's int8 target out of reach of every candidate that its 50-photograph
# verdict then passed (0.990 needed, 0.986-0.991 expected, 0.9920 judged): 80 %
SEARCH_CONFIDENCE = 0.8
CALIB_CROPS_UNDER = 16  # calibration photographs: fewer are also cropped (calibration_batches)
PHOTO_BATCH = 2  # real images per run (memory at large sizes: ViT-B/16 at 448, batch 8 held 4 GB)


class Evaluator:
    """Measures a candidate model against the bundle's fp32 model: on real images (the
    verdict), on seeded noise (beside them), and on the digits where asked."""

    def __init__(self, bundle: Path, manifest: Manifest, *, eval_set: str | None = None,
                 images: EvalImages | None = None):
        from vit_deploy.runtime.preprocess import Preprocess

        self.manifest = manifest
        cfg = manifest.config
        self.reference = manifest.model_path(bundle, "fp32")
        self.resolutions = judged_resolutions(manifest)
        self.inputs = [sample_inputs(hw, 2, channels=cfg.in_chans, seed=11)
                       for hw in self.resolutions]
        if images is None:  # the digits model's own held-out data, else the photographs
            images = digits_images() if eval_set == "digits" else resolve(None, None)[1]
        self.images = images
        views = self.images.views()
        self.photo_inputs = []
        for hw in self.resolutions:
            pre = Preprocess.from_manifest(manifest, resolution=hw,
                                           resize="shorter_side_center_crop")
            self.photo_inputs.append(np.stack([pre.array(v) for v in views]))
        self.digits = None
        if eval_set == "digits":
            from vit_deploy.data import load_digits_split, normalise

            split = load_digits_split()
            self.digits = (normalise(split["test_images"]), split["test_labels"])
        self._calib_refs: dict[int, list[dict[str, np.ndarray]]] = {}
        with ViTSession(self.reference) as s:  # one fp32 session for every reference
            self.refs = [s.run_all(x) for x in self.inputs]  # every output is judged
            _run_batched(s, self.photo_inputs[0][:1])  # warm: the timings compare like runs
            start = time.perf_counter()
            self.photo_refs = [_run_batched(s, x) for x in self.photo_inputs]
            self.fp32_seconds = time.perf_counter() - start
            if self.digits is not None:
                self.fp32_pred = s.run(self.digits[0]).argmax(1)

    def parity(self, path: Path, precision: str) -> ParityReport:
        """On seeded noise: the figures beside the real ones."""
        with ViTSession(path) as s:
            return ParityReport(cases=compare(s.run_all, self.refs, self.inputs,
                                              precision=precision, provider="cpu"))

    def photos(self, path: Path, precision: str) -> list[PhotoCase]:
        """On the real images, at every size the evaluator measures; `last_seconds` is how
        long the candidate took on them (fp32: `fp32_seconds`, the same runs)."""
        with ViTSession(path) as s:
            _run_batched(s, self.photo_inputs[0][:1])
            start = time.perf_counter()
            outs = [_run_batched(s, x) for x in self.photo_inputs]
            self.last_seconds = time.perf_counter() - start
        labels, groups = self.images.labels(), self.images.groups()
        return [case for hw, ref, out in zip(self.resolutions, self.photo_refs, outs)
                for case in judge_photos(ref, out, resolution=hw, precision=precision,
                                         labels=labels, groups=groups)]

    def calibration_refs(self, calibration: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        """fp32's outputs on the calibration batches (computed once, image by image)."""
        key = id(calibration)
        if key not in self._calib_refs:
            with ViTSession(self.reference) as s:
                self._calib_refs[key] = [_run_batched(s, x, 1) for x in calibration]
        return self._calib_refs[key]

    def calibration_score(self, path: Path, calibration: Sequence[np.ndarray]) -> Score:
        """How a candidate agrees with fp32 on the calibration images (what the recipe
        search and smoothing are chosen on: the judging images stay held out), with the
        worst expected on as many other photographs as the verdict judges: the batches of
        one size taken together, each block of `framings` images one photograph (what
        calibration_batches writes)."""
        outs: dict[tuple[int, ...], list[tuple[dict, dict]]] = {}
        with ViTSession(path) as s:
            for x, ref in zip(calibration, self.calibration_refs(calibration)):
                outs.setdefault(tuple(x.shape[2:]), []).append((ref, _run_batched(s, x)))
        cases = []
        for hw, pairs in outs.items():
            ref, out = ({k: np.concatenate([p[i][k] for p in pairs]) for k in pairs[0][i]}
                        for i in (0, 1))
            groups, start = [], 0
            for ref_batch, _ in pairs:  # numbered apart: batches hold whole photographs
                blocks = photo_blocks(len(next(iter(ref_batch.values()))),
                                      framings_of(calibration))
                groups += [start + g for g in blocks]
                start += len(set(blocks))
            cases += judge_photos(ref, out, resolution=hw, precision="int8", groups=groups,
                                  others=self.images.photographs, confidence=SEARCH_CONFIDENCE)
        return Score.of(cases)

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
        """The sensitivity metric: accuracy points lost (trained model) or 1 - the worst
        per-image cosine on the real images."""
        acc = self.accuracy(path)
        if acc is not None:
            return acc["drop"]
        return 1.0 - min(c.cosine_min for c in self.photos(path, precision))


LARGE_GRID = 1024  # tokens: above it, a native-size bundle's second size is smaller, not larger


def judged_resolutions(manifest: Manifest) -> list[tuple[int, int]]:
    """The sizes a precision is calibrated and judged at: a static graph's own; for a
    dynamic one the native size and one other (the deploy size; else 1.5 × native, or 2/3
    of native where 1.5 × would pass LARGE_GRID tokens: the second size checks the grid
    resampled in the graph, which a smaller grid checks as well at a fraction of the cost;
    every recipe candidate is scored there), and when neither is non-square, the one that
    is not the deploy size has its width cut to 3/4 (in whole patches): a square pair cannot
    tell a grid resampled with its axes swapped from a right one. The trained DINOv2-S at
    224 is judged at 518x392 and 224; at 518 (its native size), at 518 and 350x266."""
    cfg = manifest.config
    P, native, deploy = cfg.patch_size, cfg.img_size, manifest.deploy_resolution
    if not manifest.io.dynamic:
        return [deploy]
    scale = 1.5 if (1.5 * native[0] / P) * (1.5 * native[1] / P) <= LARGE_GRID else 2 / 3
    other = deploy if deploy != native else (P * max(1, round(native[0] * scale / P)),
                                             P * max(1, round(native[1] * scale / P)))
    sizes = [tuple(native), tuple(other)]
    if all(h == w for h, w in sizes):
        i = 0 if sizes[0] != tuple(deploy) else 1
        h, w = sizes[i]
        sizes[i] = (h, P * max(1, round(w * 0.75 / P)))
    return sizes


@dataclass(frozen=True)
class Score:
    """A candidate's agreement with fp32 on a set of images: the worst per-image cosine
    (each output whole; a patch grid as one vector), the worst 1st percentile of per-token
    cosine, over every size and output, and the worst image expected on as many other
    photographs as the verdict judges (agreement.expected_worst: the spread between the
    images scored, not a fixed margin)."""

    worst: float
    token_p1: float | None
    expected: float | None = None

    @classmethod
    def of(cls, cases: Sequence[PhotoCase]) -> Score:
        tokens = [c.token_cosine_p1 for c in cases if c.token_cosine_p1 is not None]
        expected = [c.expected_worst for c in cases]
        return cls(min(c.cosine_min for c in cases), min(tokens) if tokens else None,
                   None if not expected or None in expected else min(expected))

    def meets(self, target: Score) -> bool:
        """Whether every measure reaches `target`'s: the expected worst where both have
        one, else the observed worst."""
        worst = (self.expected >= target.expected if self.expected is not None
                 and target.expected is not None else self.worst >= target.worst)
        return worst and (target.token_p1 is None or self.token_p1 is None
                          or self.token_p1 >= target.token_p1)

    def __str__(self) -> str:
        return (f"worst {self.worst:.5f}"
                + (f" (expected on other photographs >= {self.expected:.5f})"
                   if self.expected is not None else "")
                + (f", tokens p1 {self.token_p1:.5f}" if self.token_p1 is not None else ""))

    def to_dict(self) -> dict[str, float | None]:
        return {"worst": round(self.worst, 6),
                "token_p1": None if self.token_p1 is None else round(self.token_p1, 6),
                "expected": None if self.expected is None else round(self.expected, 6)}


def photo_blocks(n: int, framings: int) -> list[int]:
    """Which photograph each of `n` calibration images of one batch is a view of: blocks
    of `framings` (a photograph whole and its crops; calibration_batches keeps a
    photograph's views in one batch)."""
    return [i // max(1, framings) for i in range(n)]


def _run_batched(session: ViTSession, x: np.ndarray,
                 batch: int = PHOTO_BATCH) -> dict[str, np.ndarray]:
    parts = [session.run_all(x[i:i + batch]) for i in range(0, len(x), batch)]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


class Calibration(list):
    """Calibration batches (a list of (n, C, H, W) arrays, every size the precision is
    judged at), each batch holding whole photographs: `framings` consecutive images are
    views of one photograph (it whole and its crops), so the recipe search can split and
    score them by photograph. A plain list of arrays counts each image as a photograph."""

    framings: int = 1

    def like(self, batches: Sequence[np.ndarray]) -> Calibration:
        out = Calibration(batches)
        out.framings = self.framings
        return out


def framings_of(calibration: Sequence[np.ndarray]) -> int:
    return getattr(calibration, "framings", 1)


def calibration_batches(manifest: Manifest, source: str | Path | Sequence[Path] | None, *,
                        limit: int = 64, batch: int = 6,
                        resolutions: Sequence[tuple[int, int]] | None = None
                        ) -> Calibration:
    """Calibration inputs, preprocessed as the manifest says, at every size the precision
    is judged at (a dynamic graph runs at several: static int8's activation ranges taken
    at the native size alone clipped the trained digits model at 48x48, cosine 0.967 vs
    0.991): image files, a folder of images, 'digits' (the trained test model's training
    split, shipped with the package), or None / 'photos' (the real photographs shipped
    for calibration). `resolutions`: these sizes instead (a static graph's own). Fewer than
    CALIB_CROPS_UNDER photographs are each taken whole and as two crops (static int8's
    ranges from 6 photographs framed once clipped the held-out ones: 0.988 vs 0.994); more
    are taken whole (the shipped 20: the search's candidates cost a third as much). A
    batch holds `batch` images, rounded down to whole photographs."""
    from vit_deploy.precisions.photos import SHIPPED, EvalImages, image_files, shipped
    from vit_deploy.runtime.preprocess import Preprocess

    framings = 1
    if str(source) == "digits":
        from vit_deploy.data import load_digits_split

        images: list[Any] = list(load_digits_split()["train_images"][:limit])
    else:
        if isinstance(source, (list, tuple)):
            files = list(source)
        elif source is None or str(source) == SHIPPED:
            files = shipped("calib")
        else:
            files = image_files(source, "--calib")
        files = files[:limit]
        crops = len(files) < CALIB_CROPS_UNDER
        framings = FRAMINGS if crops else 1
        images = EvalImages(tuple(files), "", crops=crops).views()
    batch = max(framings, batch - batch % framings)
    batches = Calibration()
    batches.framings = framings
    for hw in resolutions or judged_resolutions(manifest):
        pre = Preprocess.from_manifest(manifest, resolution=hw, resize="shorter_side_center_crop")
        x = np.stack([pre(image) for image in images])
        batches += [x[i:i + batch] for i in range(0, len(x), batch)]
    return batches


def calibration_text(count: int) -> str:
    """How many calibration photographs, and how each is framed (calibration_batches)."""
    return (f"{count} images" + (", each whole and two crops" if count < CALIB_CROPS_UNDER
                                 else ", each whole"))


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
