"""`vit-deploy quantize` on a SigLIP 2 NaFlex bundle: dynamic int8 (and fp16), quantised as
any bundle's (quantize.py), judged on what the user will feed it: the shipped photographs
at their own aspect ratios and cropped to 1:4 .. 4:1, one mixed batch each, every output
by the precision's cosine floor (photos.judge_photos; last_hidden_state at the real
patches only); seeded noise images beside them. add.py writes those that pass
into the bundle, atomically, as for any bundle. Static int8 and int4 need NCHW
calibration inputs: refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vit_deploy.parity import ParityReport
from vit_deploy.precisions.photos import _cosines, judge_photos
from vit_deploy.progress import Progress, silent
from vit_deploy.precisions.quantize import QuantOptions, quantize_model
from vit_deploy.runtime.contract import PRECISION_FILES
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.naflex.contract import NAFLEX_OUTPUTS, NAFLEX_PRECISIONS
from vit_deploy.runtime.naflex.references import (NAFLEX_SIZES, REFERENCE_CASES,
                                                  reference_image)
from vit_deploy.runtime.naflex.session import NaFlexSession
from vit_deploy.runtime.ort_session import RuntimeOptions

JUDGED_ON = ("the 12 core shipped photographs at their own aspect ratios, and 6 of them cropped "
             "to 1:1, 4:1, 1:4, 3:2, 2:3, 16:9 (width:height)")


@dataclass
class NaFlexCandidate:
    """One precision quantised into `path` and judged: on the photographs (the verdict) and
    on noise (beside them, as parity rows)."""

    precision: str
    path: Path
    recipe: dict
    photos: list
    noise: ParityReport

    @property
    def passed(self) -> bool:
        return bool(self.photos) and all(c.passed for c in self.photos)


def naflex_candidates(bundle: Path, manifest: Manifest, precisions: Sequence[str],
                      staging: Path, *, quant: QuantOptions = QuantOptions(),
                      progress: Progress = silent) -> list[NaFlexCandidate]:
    """Each precision of `precisions` (fp32 skipped) quantised into `staging` and judged
    against the bundle's fp32 model; add.py writes those that pass."""
    wanted = [p for p in dict.fromkeys(precisions) if p != "fp32"]
    refused = [p for p in wanted if p not in NAFLEX_PRECISIONS]
    if refused:
        raise ValueError(f"a NaFlex bundle takes {list(NAFLEX_PRECISIONS)} (quantised without "
                         f"NCHW calibration images); {refused} cannot apply")
    batches = naflex_eval_batches()
    progress("running the fp32 reference")
    with NaFlexSession(bundle, options=RuntimeOptions(verify=False)) as s:
        budget = s.preprocess.max_num_patches
        refs = [(name, images, masked(s, images)) for name, images in batches]
    out = []
    for precision in wanted:
        progress(f"{precision}: quantising")
        dst = staging / PRECISION_FILES[precision]
        q = quantize_model(manifest.model_path(bundle, "fp32"), dst, precision=precision,
                           options=quant)
        progress(f"{precision}: judging on the photographs and noise")
        photos, noise = [], ParityReport()
        with NaFlexSession(dst, max_num_patches=budget) as s:
            for name, images, want in refs:
                cases = judge_tokens(want, masked(s, images), s, images, precision)
                if name.startswith("photos"):
                    photos += cases
                else:
                    noise.cases += _as_parity(cases, precision, name)
        out.append(NaFlexCandidate(precision, dst, q.recipe, photos, noise))
    return out


def naflex_eval_batches() -> list[tuple[str, list[np.ndarray]]]:
    """(name, images): the photographs whole, cropped to six ratios, then the noise cases."""
    from PIL import Image

    from vit_deploy.data import photo_paths, photos_at_ratios

    whole = [np.asarray(Image.open(p).convert("RGB"))
             for role in ("calib", "eval") for p in photo_paths(role, core=True)]
    cropped = photos_at_ratios("eval", NAFLEX_SIZES)
    return [("photos", whole), ("photos cropped", cropped),
            *((name, [reference_image(seed, hw) for seed, hw in images])
              for name, images in REFERENCE_CASES)]


def masked(session: NaFlexSession, images: list[np.ndarray]) -> dict[str, np.ndarray]:
    """session.outputs, with the mask of the real patches beside them."""
    batch = session.preprocess(images)
    return {**session.outputs(batch), "mask": batch.pixel_attention_mask.astype(bool)}


def judge_tokens(want, got, session, images, precision):
    """judge_photos on pooled and last_hidden_state (per image: its real patches; the
    per-token figures over real patches only)."""
    grid = session.preprocess.grid(images[0].shape[1], images[0].shape[0])
    P = session.config.patch_size
    cases = judge_photos({o: want[o] for o in NAFLEX_OUTPUTS}, {o: got[o] for o in NAFLEX_OUTPUTS},
                         resolution=(grid[0] * P, grid[1] * P), precision=precision)
    mask = want["mask"]
    real = _cosines(want[NAFLEX_OUTPUTS[1]][mask].astype(np.float64),
                    got[NAFLEX_OUTPUTS[1]][mask].astype(np.float64))
    return [dataclasses.replace(c, token_cosine_min=float(real.min()),
                                token_cosine_p1=float(np.percentile(real, 1)),
                                token_cosine_median=float(np.median(real)))
            if c.output == NAFLEX_OUTPUTS[1] else c for c in cases]


def _as_parity(cases, precision, name):
    """Noise cases as ParityCase rows (the report's 'noise cos' column)."""
    from vit_deploy.parity import ParityCase

    return [ParityCase(resolution=c.resolution, batch=c.images, provider="cpu",
                       precision=precision, max_abs=c.max_abs, max_rel=float("nan"),
                       cosine=c.cosine_min, top1_agree=None, abs_tol=None,
                       cosine_min=c.floor, passed=c.passed, output=c.output,
                       case=f"naflex {name}") for c in cases]
