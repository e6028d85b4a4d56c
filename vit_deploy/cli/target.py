"""`vit-deploy target`: fixed-shape bucket graphs for an edge target."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from vit_deploy.cli.group import fail
from vit_deploy.cli.options import console, quiet_option
from vit_deploy.cli.params import InputPath
from vit_deploy.runtime.contract import TARGETS


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@click.option("--target", "target_name", type=click.Choice(TARGETS), required=True,
              help="cpu / mobile / web: fp32 (+ int8 if the bundle has it); npu: int8-static "
                   "(QDQ); tensorrt: fp32 and fp16. mobile and web also get ORT format.")
@click.option("--buckets", required=True, metavar="R1,R2,...", help="Resolution buckets, N or "
              "HxW, comma-separated (e.g. 224,256x320,448): one static graph each per "
              "precision.")
@click.option("--batch", type=click.IntRange(1, 64), default=1, show_default=True,
              help="The fixed batch of every graph (1 to 64).")
@click.option("--calib", default=None, metavar="DIR|digits", help="npu (int8-static): "
              "calibration images, a folder or 'digits'.")
@click.option("--calib-samples", type=click.IntRange(1, 100_000), default=64, show_default=True,
              help="npu: calibration images used at most (1 to 100000).")
@click.option("--activations", "activation_bits", type=click.Choice(["8", "16"]), default="8",
              show_default=True, help="npu: activation bits of the int8-static graphs; 16 is "
              "w8a16 (uint16 activations, int8 weights), as Qualcomm's NPUs run ViTs.")
@quiet_option("nothing is printed on success; a failure is one line on stderr (exit 1)")
def target(bundle: Path, target_name: str, buckets: str, batch: int, calib: str | None,
           calib_samples: int, quiet: bool, activation_bits: str = "8") -> None:
    """Add an edge target to BUNDLE: per bucket a fixed-shape graph per precision.

    Each graph is checked against PyTorch (the bundle's weights) at exactly its size; one
    that fails is not written and the exit code is 1. The runtime picks a bucket per image
    (nearest aspect ratio, then area) and keeps the dynamic graph for other sizes.

    \b
    Example:
      vit-deploy target vit-B16-224 --target mobile --buckets 224,256x320,448
    """
    from vit_deploy.progress import steps
    from vit_deploy.targets.build import TargetOptions, add_target, parse_buckets

    try:
        sizes = parse_buckets(buckets)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--buckets") from None
    if activation_bits == "16" and target_name != "npu":
        raise click.BadParameter(f"16-bit activations are for the npu target's int8-static "
                                 f"graphs, not --target {target_name}",
                                 param_hint="--activations")
    options = TargetOptions(target=target_name, buckets=sizes, batch=batch, calibration=calib,
                            calibration_samples=calib_samples, activation_bits=int(activation_bits))
    with steps(quiet=quiet, title="target") as progress:
        report = add_target(bundle, options, progress=progress)
    if quiet:
        if not report:
            fail(1, f"target {target_name}: {len(report.failed)} graph(s) failed the "
                    f"tolerance policy and were not written")
        return
    console().print(report)
    if not report:
        sys.exit(1)
