"""The quantisation flags (`options.quant_options`, shared by `quantize` and `export
--precision`) turned into typed options, calibration and judging images, and the one call
that adds the precisions: commands import this, never each other."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from vit_deploy.cli.group import fail
from vit_deploy.cli.options import console


def refuse_for_naflex(precisions: tuple[str, ...], *, calib: str | None,
                      eval_images: str | None, smooth: str, max_drop: float | None,
                      eval_set: str | None, calib_method: str, calib_samples: int,
                      float_head: bool, **_: Any) -> None:
    """Exit 2 naming what a SigLIP 2 NaFlex bundle cannot take: a precision other than
    NAFLEX_PRECISIONS, a flag that would not be applied. `export --naflex` asks before it
    writes anything (it once refused --smooth after writing the bundle)."""
    from vit_deploy.runtime.naflex.contract import NAFLEX_PRECISIONS

    other = [p for p in dict.fromkeys(precisions) if p not in ("fp32", *NAFLEX_PRECISIONS)]
    if other:
        fail(2, f"a SigLIP 2 NaFlex bundle takes {', '.join(NAFLEX_PRECISIONS)} (quantised "
                f"without NCHW calibration images); {', '.join(other)} cannot apply")
    given = [flag for flag, value, default in (
        ("--calib", calib, None), ("--eval", eval_images, None), ("--smooth", smooth, "auto"),
        ("--max-drop", max_drop, None), ("--eval-set", eval_set, None),
        ("--calib-method", calib_method, "minmax"), ("--calib-samples", calib_samples, 64),
        ("--float-head", float_head, False)) if value != default]
    if given:
        fail(2, f"{' '.join(given)}: not applied to a SigLIP 2 NaFlex bundle: its int8 is "
                f"dynamic (no calibration images, no smoothing), it has no classifier "
                f"head, and it is judged on the shipped photographs at their own aspect "
                f"ratios; leave {'it' if len(given) == 1 else 'them'} out")


def add_precisions(bundle: Path, precisions: tuple[str, ...], *, force: bool, quiet: bool,
                   calib: str | None, eval_images: str | None, smooth: str, calib_method: str,
                   calib_samples: int, block_size: int, exclude: str, float_head: bool,
                   max_drop: float | None, eval_set: str | None, int8_cpu: str) -> None:
    """The quantisation options group (options.quant_options) -> precisions.add_precisions,
    its report printed; exit 1 if every precision failed, 3 if some passed and some
    did not (PrecisionsReport.exit_code). `export --precision` ends with it."""
    from vit_deploy.precisions.photos import resolve
    from vit_deploy.precisions.evaluate import calibration_batches, calibration_text
    from vit_deploy.precisions.add import PrecisionOptions, add_precisions as add
    from vit_deploy.progress import steps
    from vit_deploy.precisions.quantize import QuantOptions
    from vit_deploy.runtime.manifest import load_manifest

    if load_manifest(bundle, verify=False).naflex:  # never silently ignored
        refuse_for_naflex(precisions, calib=calib, eval_images=eval_images, smooth=smooth,
                          max_drop=max_drop, eval_set=eval_set, calib_method=calib_method,
                          calib_samples=calib_samples, float_head=float_head)
    quant = QuantOptions(exclude=tuple(e.strip() for e in exclude.split(",") if e.strip()),
                         calibration=calib_method, block_size=block_size, head=not float_head,
                         cpu=int8_cpu)
    try:
        calib_files, judged = resolve(calib, eval_images)
        alpha = smooth_alpha(smooth)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    named = calib or "real photographs shipped with vit-deploy"
    source = ("the digits' training split" if calib_files == "digits" else
              calibration_text(min(len(calib_files), calib_samples)).replace(
                  " images", f" images ({named})", 1))
    options = PrecisionOptions(quant=quant, max_drop=max_drop, force=force, eval_set=eval_set,
                               eval_images=judged, smooth=alpha, calibration_source=source)
    calibration = (calibration_batches(load_manifest(bundle), calib_files, limit=calib_samples)
                   if any(p.startswith("int8") for p in precisions) else None)
    with steps(quiet=quiet, title="quantising") as progress:
        report = add(bundle, precisions, calibration=calibration, options=options,
                     progress=progress)
    code = report.exit_code
    if quiet:
        if code:
            fail(code, f"{', '.join(report.failed)} outside the tolerance policy"
                       + ("; written anyway (--force)" if force else "; not written")
                       + (f"; {', '.join(report.passed)} passed and written"
                          if report.passed else ""))
        return
    console().print(report)
    if code:
        sys.exit(code)


def smooth_alpha(text: str) -> str | float | None:
    """--smooth: 'auto', 'none' or an alpha within [0, 1]."""
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    try:
        alpha = float(text)
    except ValueError:
        alpha = -1.0
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"--smooth must be auto, none or a number within [0, 1], got {text!r}")
    return alpha
