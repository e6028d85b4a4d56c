"""`vit-deploy sweep`: patch size × token merging × precision, scored, timed, and the
Pareto front."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import console, emit_json, json_file, json_option, json_to_stdout, output_file, quiet_option, refuse_clobber, threads_option
from vit_deploy.cli.params import MAX_PATCH, RESOLUTION, InputPath, PrecisionList


@click.command()
@click.argument("checkpoint", type=InputPath("checkpoint"))
@click.option("--patch", "patches", default=None, metavar="P1,P2,...",
              help="Patch sizes to deploy at (the kernel PI-resized). Default: the checkpoint's.")
@click.option("--merge-tokens", "merges", default="0", show_default=True, metavar="SPECS",
              help="Token-merging settings: numbers per block, comma-separated (0,4,8), or "
                   "';'-separated schedules (0;4,4,2,2).")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True, help="Comma-separated precisions to deploy each "
              "configuration at, or all.")
@click.option("--res", "resolution", type=RESOLUTION, default=None,
              help="Resolution of every configuration, N or HxW. Default: the checkpoint's "
                   "native one.")
@click.option("--eval-set", type=click.Choice(["digits", "none"]), default="none",
              show_default=True, help="digits: held-out accuracy of the shipped trained test "
              "models; none: cosine to the unmerged model at the checkpoint's patch size.")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Timing rounds, interleaved over the configurations.")
@click.option("--runs", type=click.IntRange(1, 100_000), default=20, show_default=True,
              help="Timed runs per configuration and round.")
@threads_option
@click.option("--budget-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Name the best-scoring configuration whose p90 stays under this.")
@json_option("The table and its Pareto front")
@output_file("--plot", "plot_out", help="Write a PNG to FILE: score against p90 latency, with "
             "the Pareto front.")
@quiet_option("nothing is printed but --json's JSON")
def sweep(checkpoint: Path, patches: str | None, merges: str, precisions: tuple[str, ...],
          resolution: tuple[int, int] | None, eval_set: str, rounds: int, runs: int,
          threads: int | None, budget_ms: float | None, json_out: Path | None,
          plot_out: Path | None, quiet: bool) -> None:
    """Export CHECKPOINT at every patch size × token merging × precision, score and time
    each (one fresh process per timing), and print the table and its Pareto front.

    \b
    Example:
      vit-deploy sweep vit_deploy/data/digits64_flexi_vit.safetensors --patch 8,16 --json s.json
    """
    from vit_deploy.progress import steps
    from vit_deploy.reports.save import save_report
    from vit_deploy.sweep import SweepOptions, parse_list, run_sweep

    refuse_clobber({"--json": json_out, "--plot": plot_out}, bundles=[checkpoint])
    sizes = parse_list(patches, int)
    if any(not 1 <= p <= MAX_PATCH for p in sizes):  # 0 divided by zero in the model
        raise click.BadParameter(f"patch sizes must be positive integers up to {MAX_PATCH}, "
                                 f"got {patches!r}", param_hint="--patch")
    options = SweepOptions(patches=sizes, merges=parse_list(merges) or ("0",),
                           precisions=precisions, resolution=resolution,
                           eval_set=None if eval_set == "none" else eval_set, rounds=rounds,
                           runs=runs, threads=threads, budget_ms=budget_ms)
    with steps(quiet=quiet, title="sweeping") as progress:
        report = run_sweep(checkpoint, options, progress=progress)
    if json_to_stdout(json_out):
        emit_json(json_out, report.to_json())
    elif not quiet:
        console().print(report)
    save_report(report, json=json_file(json_out), plot=plot_out)
