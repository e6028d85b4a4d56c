"""`vit-deploy check` on a SigLIP 2 NaFlex bundle: every provider x precision against PyTorch
(NaFlexViT rebuilt from the bundle's weights) or the bundle's golden references, on images
of six aspect ratios (1:1, 1:4, 4:1, 2:3, 3:2, 9:16) in one mixed batch and a tall and a
wide image alone; with PyTorch also the shipped photographs cropped to those ratios. Each
output is judged by the tolerance policy (parity.judge), last_hidden_state at the real
patches only; batch independence and determinism on the mixed batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from vit_deploy.check.sessions import sessions
from vit_deploy.data import photos_at_ratios
from vit_deploy.parity import INDEPENDENCE_ABS_TOL, Invariant, judge
from vit_deploy.progress import Progress
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.naflex.contract import NAFLEX_OUTPUTS
from vit_deploy.runtime.naflex.references import (NAFLEX_SIZES, REFERENCE_CASES,
                                                  iter_naflex_references, reference_image)
from vit_deploy.runtime.naflex.session import NaFlexSession

Case = tuple[str, list[np.ndarray], dict[str, np.ndarray]]  # name, images, reference outputs


def check_naflex(bundle: Path, manifest: Manifest, options, precisions: Sequence[str],
                 report, progress: Progress, *, golden: bool) -> None:
    """Fill check.run_check's `report` (a CheckReport) for a NaFlex bundle, by its
    `options` (check.CheckOptions) and `precisions`, against its golden references
    (`golden`: run_check chose them) or PyTorch."""
    if options.resolutions:
        raise ValueError("a NaFlex bundle takes each image at its own aspect ratio and patch "
                         "grid: --res cannot apply (its cases span 1:4 to 8:1)")
    if tuple(options.batches) != type(options)().batches:  # other than the default
        raise ValueError(f"a NaFlex bundle is checked on one mixed batch of six aspect ratios "
                         f"and on single images: --batch {','.join(map(str, options.batches))} "
                         f"cannot apply")
    if golden:
        refs = manifest.naflex_references
        progress(f"reading the golden references ({len(refs.cases)} cases)")
        cases: list[Case] = [(c.name, images, outs) for c, images, outs in
                             iter_naflex_references(manifest.resolve(bundle, refs.file), refs)]
        report.reference = f"golden references ({refs.source})"
    else:
        progress("rebuilding the PyTorch reference from the bundle's weights")
        forward = _torch_forward(bundle, manifest)
        named = [(name, [reference_image(seed, hw) for seed, hw in images])
                 for name, images in REFERENCE_CASES]
        named.append(("photos", photos_at_ratios("eval", NAFLEX_SIZES)))
        progress(f"running PyTorch on {len(named)} cases")
        cases = [(name, images, forward(images)) for name, images in named]
    for ran, precision, session in sessions(bundle, options, tuple(precisions), report,
                                            progress):
        for name, images, want in cases:
            progress(f"{ran} {precision}: {name}")
            report.parity.cases += judge_case(session, name, images, want,
                                              provider=ran, precision=precision)
        report.parity.checks += invariants(session, cases[0][1], f"{ran}:{precision}")


def judge_case(session: NaFlexSession, name: str, images: list[np.ndarray],
               want: dict[str, np.ndarray], *, provider: str, precision: str) -> list:
    got = session.outputs(images)
    sizes = ",".join(f"{im.shape[0]}x{im.shape[1]}" for im in images[:6])  # H x W
    label = f"naflex {name} ({sizes}{', ...' if len(images) > 6 else ''})"
    P = session.config.patch_size
    grid = tuple(int(v) * P for v in session.preprocess.grid(images[0].shape[1],
                                                               images[0].shape[0]))
    return [dataclasses.replace(judge(want[o], got[o], resolution=grid, provider=provider,
                                      precision=precision, output=o), case=label)
            for o in NAFLEX_OUTPUTS if o in want]


def invariants(session: NaFlexSession, images: list[np.ndarray], subject: str
               ) -> list[Invariant]:
    """Batch independence (only the last image changes: no other pooled vector may move)
    and determinism (the same batch twice), on a mixed batch."""
    a = session.features(images).pooled
    changed = [*images[:-1], 255 - images[-1]]
    b = session.features(changed).pooled
    again = session.features(images).pooled
    limit = INDEPENDENCE_ABS_TOL * max(1.0, float(np.abs(a).max()))
    moved, twice = float(np.abs(a[:-1] - b[:-1]).max()), float(np.abs(a - again).max())
    detail = f"naflex mixed batch of {len(images)} aspect ratios"
    return [Invariant(name="batch independence", subject=subject, passed=moved <= limit,
                      value=moved, limit=limit, detail=f"{detail}, last image changed"),
            Invariant(name="determinism", subject=subject, passed=twice <= limit,
                      value=twice, limit=limit, detail=f"{detail}, run twice")]


def _torch_forward(bundle: Path, manifest: Manifest
                   ) -> Callable[[list[np.ndarray]], dict[str, np.ndarray]]:
    try:
        from vit_deploy.export.checkpoints import load_model
        from vit_deploy.export.naflex.model import NaFlexViT
        from vit_deploy.export.naflex.bundle import naflex_forward
    except ImportError:
        raise ImportError("vit-deploy check compares against PyTorch, which is not installed: "
                          "pip install 'vit-deploy[export]' (or --reference bundle)") from None
    if manifest.weights_file is None:
        raise ValueError(f"bundle {str(bundle)!r} holds no PyTorch weights to compare against")
    from vit_deploy.runtime.naflex.preprocess import NaFlexPreprocess

    reference = NaFlexViT(load_model(manifest.resolve(bundle, manifest.weights_file))).eval()
    spec = manifest.preprocess
    pre = NaFlexPreprocess(patch_size=manifest.config.patch_size, mean=spec.mean, std=spec.std,
                           max_num_patches=spec.max_num_patches)
    return lambda images: naflex_forward(reference, pre, images)
