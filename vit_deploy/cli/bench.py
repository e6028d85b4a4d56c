"""`vit-deploy bench`: latency per provider × precision × size, or saved reports (from
one machine or several) side by side with --compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from vit_deploy.cli.options import MAX_THREADS, batches_option, console, emit_json, json_file, json_option, json_to_stdout, output_file, provider_option, quiet_option, refuse_clobber, resolutions_option
from vit_deploy.cli.params import InputPath, PrecisionList, count, csv_list, providers_list
from vit_deploy.runtime.contract import TARGETS

SPINNING = {"auto": None, "on": True, "off": False}


def _float_precision(text: str) -> str:
    if text not in ("f32", "bf16"):
        raise ValueError(f"expected f32 or bf16, got {text[:20]!r}")
    return text


@click.command()
@click.argument("paths", metavar="BUNDLE | --compare REPORT.json...", nargs=-1,
                type=InputPath("bundle or report"))
@provider_option(measured=True)
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True, help="Comma-separated precisions to measure, or all.")
@resolutions_option("Comma-separated resolutions, e.g. 224,448,320x480 (default: the "
                    "bundle's).")
@batches_option("1")
@click.option("--threads", default="default", show_default=True, metavar="T1,T2,...|default",
              callback=csv_list(count("threads", MAX_THREADS, default="default")),
              help="Comma-separated intra-op thread counts, or 'default'.")
@click.option("--warmup", type=click.IntRange(0, 10_000), default=5, show_default=True,
              help="Untimed runs per case first.")
@click.option("--runs", type=click.IntRange(1, 1_000_000), default=30, show_default=True,
              help="Timed runs per case and session.")
@click.option("--seconds", type=click.FloatRange(0.1, 86_400), default=None,
              help="Time per group instead of a run count.")
@click.option("--sessions", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Fresh sessions per case, used in turn (their medians show the spread).")
@click.option("--baseline", type=click.Choice(["none", "torch"]), default="none",
              show_default=True, help="Add a PyTorch eager fp32 row, interleaved with the rest.")
@click.option("--fallback", is_flag=True, help="Let providers fall back (reported) instead of "
              "being listed as unavailable.")
@click.option("--spinning", type=click.Choice(list(SPINNING)), default="auto",
              show_default=True, help="ORT idle-thread spinning; auto: off when several "
              "sessions are interleaved (idle spinners steal the cores).")
@json_option("The report (with --compare: the comparison)")
@output_file("--csv", "csv_out", help="Write the report's rows as CSV to FILE.")
@output_file("--plot", "plot_out", help="Write a PNG to FILE: latency against resolution per "
             "provider and precision (matplotlib).")
@click.option("--budget-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Say the largest resolution whose p90 at batch 1 stays under this.")
@click.option("--compare", is_flag=True, help="Show the saved JSON reports given (bench "
              "--json, from this machine or others) side by side instead: p50 / p90 and the "
              "provider that ran, per report. No bundle needed.")
@click.option("--target", "bench_target", type=click.Choice(TARGETS), default=None,
              help="Also measure this edge target's bucket graphs beside the dynamic graph, at "
                   "the same sizes (default sizes: its buckets).")
@click.option("--io-binding", is_flag=True, help="Bind inputs and outputs to the provider's "
              "device (CUDA).")
@click.option("--floor", is_flag=True, help="Measure this CPU's fp32 and int8 GEMM peaks "
              "(the model's MLP product, through ONNX Runtime, with each --threads) and show "
              "each CPU case as a fraction of its floor: the least time those peaks allow.")
@click.option("--float-precision", "float_precisions", default="f32", show_default=True,
              metavar="f32,bf16", callback=csv_list(_float_precision),
              help="What is not int8 runs in, each measured: bf16 on OpenVINO's engine where "
                   "the CPU has AMX or AVX-512 BF16 (RuntimeOptions.float_precision); other "
                   "engines report bf16 unavailable.")
@quiet_option("nothing is printed but --json's JSON")
def bench(paths: tuple[Path, ...], providers: str, precisions: tuple[str, ...],
          resolutions: tuple[tuple[int, int], ...] | None, batches: tuple[int, ...],
          threads: tuple[int | None, ...], warmup: int, runs: int, seconds: float | None,
          sessions: int, baseline: str, fallback: bool, spinning: str, json_out: Path | None,
          csv_out: Path | None, plot_out: Path | None, budget_ms: float | None,
          compare: bool, bench_target: str | None, io_binding: bool, floor: bool,
          quiet: bool, float_precisions: tuple[str, ...] = ("f32",)) -> None:
    """Measure latency, throughput, cold start and memory per provider and precision.

    Cases run in one process, interleaved run by run, over several sessions each.
    Every row says which provider actually ran (openvino: the OpenVINO engine). With
    --compare, show saved reports (`bench --compare a.json b.json c.json`) side by side
    instead.

    \b
    Example:
      vit-deploy bench vit-B16-224 --provider cpu,cuda --precision fp32,int8 --res 224,448
    """
    from vit_deploy.bench.run import BenchOptions, run_bench
    from vit_deploy.bench.compare import compare_reports
    from vit_deploy.reports.save import save_report

    outputs = {"--json": json_out, "--csv": csv_out, "--plot": plot_out}
    screen = console()
    if compare:
        refuse_clobber(outputs, inputs=paths)
        if not paths:
            raise click.UsageError("--compare needs the saved reports: bench --compare "
                                   "a.json b.json ...")
        unused = [flag for flag, given in (("--csv", csv_out), ("--plot", plot_out),
                                           ("--budget-ms", budget_ms)) if given is not None]
        if unused:
            raise click.UsageError(f"{', '.join(unused)}: only on a run; --compare shows "
                                   f"saved reports (--json writes the comparison)")
        comparison = compare_reports(paths)
        emit_json(json_out, comparison_json(comparison))
        if not quiet and not json_to_stdout(json_out):
            screen.print(comparison)
        return
    if len(paths) != 1:
        raise click.UsageError("give one BUNDLE to measure, or --compare REPORT.json ..."
                               if not paths else f"give one BUNDLE to measure (got "
                               f"{len(paths)} paths); to show saved reports add --compare")
    bundle = paths[0]
    refuse_clobber(outputs, bundles=[bundle])
    options = BenchOptions(providers=providers_list(providers), precisions=precisions,
                           resolutions=resolutions or (), batches=batches, threads=threads,
                           warmup=warmup, runs=runs, seconds=seconds, sessions=sessions,
                           baseline_torch=baseline == "torch", fallback=fallback,
                           spinning=SPINNING[spinning], target=bench_target,
                           io_binding=io_binding, floor=floor,
                           float_precisions=tuple(dict.fromkeys(float_precisions)))
    if quiet:
        report = run_bench(bundle, options)
    else:
        from rich.progress import Progress

        # progress on stderr: stdout is the result (the table, or --json's JSON)
        with Progress(console=console(stderr=True), transient=True) as bar:
            task = bar.add_task("benchmarking", total=None)
            report = run_bench(bundle, options,
                               progress=lambda d, t: bar.update(task, completed=d, total=t))
    report.budget_ms = budget_ms
    if json_to_stdout(json_out):
        emit_json(json_out, report.to_json())
    elif not quiet:
        screen.print(report)
    save_report(report, json=json_file(json_out), csv=csv_out, plot=plot_out)
    if plot_out and not quiet and not json_to_stdout(json_out):
        screen.print(f"plot: {plot_out}")


def comparison_json(comparison: Any) -> str:
    """`bench --compare --json`: the reports (one column each) and the rows side by side,
    each cell what its report says of the row (null: the report has no such case)."""
    from dataclasses import asdict

    from vit_deploy.runtime.manifest import dumps_strict

    columns = comparison.columns
    keys: dict[tuple, None] = {}
    for column in columns:
        keys.update(dict.fromkeys(column.cells))
    return dumps_strict({
        "kind": "comparison",
        "reports": [{"name": c.name, "kind": c.kind, "runtime": c.runtime, "device": c.device,
                     "machine": c.machine, "passed": c.passed} for c in columns],
        "rows": [{"provider": asked, "precision": precision, "resolution": list(res),
                  "batch": batch, "threads": threads,
                  "cells": [asdict(c.cells[k]) if k in c.cells else None for c in columns]}
                 for k in keys for asked, precision, res, batch, threads in [k]]})
