"""`vit-deploy bench`: latency per provider × precision × size, or saved reports (from
one machine or several) side by side with --compare."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import (MAX_THREADS, PrecisionList, batches_option,
                                    console, count, csv_list, output_file, providers_list,
                                    refuse_clobber, resolutions_option)
from vit_deploy.runtime.contract import TARGETS

SPINNING = {"auto": None, "on": True, "off": False}


@click.command()
@click.argument("paths", metavar="BUNDLE | --compare REPORT.json...", nargs=-1,
                type=click.Path(path_type=Path))
@click.option("--providers", default="cpu", show_default=True,
              help="Comma-separated providers to compare (cpu, cuda, tensorrt, ...).")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True)
@resolutions_option("Comma-separated resolutions, e.g. 224,448,320x480 (default: the "
                    "bundle's).")
@batches_option("1")
@click.option("--threads", default="default", show_default=True,
              callback=csv_list(count("threads", MAX_THREADS, default="default")),
              help="Comma-separated intra-op thread counts, or 'default'.")
@click.option("--warmup", type=click.IntRange(0, 10_000), default=5, show_default=True)
@click.option("--runs", type=click.IntRange(1, 1_000_000), default=30, show_default=True)
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
@output_file("--json", "json_out")
@output_file("--csv", "csv_out")
@output_file("--plot", "plot_out", help="PNG: latency against resolution per provider and "
             "precision (matplotlib).")
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
def bench(paths: tuple[Path, ...], providers: str, precisions: tuple[str, ...],
          resolutions: tuple[tuple[int, int], ...] | None, batches: tuple[int, ...],
          threads: tuple[int | None, ...], warmup: int, runs: int, seconds: float | None,
          sessions: int, baseline: str, fallback: bool, spinning: str, json_out: Path | None,
          csv_out: Path | None, plot_out: Path | None, budget_ms: float | None,
          compare: bool, bench_target: str | None, io_binding: bool) -> None:
    """Measure latency, throughput, cold start and memory per provider and precision.

    Cases run in one process, interleaved run by run, over several sessions each.
    Every row says which provider actually ran. With --compare, show saved reports
    (`bench --compare a.json b.json c.json`) side by side instead.
    """
    from rich.progress import Progress

    from vit_deploy.bench import BenchOptions, run_bench
    from vit_deploy.bench_compare import compare_reports
    from vit_deploy.reports import save_report

    outputs = {"--json": json_out, "--csv": csv_out, "--plot": plot_out}
    screen = console()
    if compare:
        refuse_clobber(outputs, inputs=paths)
        if not paths:
            raise click.UsageError("--compare needs the saved reports: bench --compare "
                                   "a.json b.json ...")
        screen.print(compare_reports(paths))
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
                           io_binding=io_binding)
    with Progress(console=screen, transient=True) as bar:
        task = bar.add_task("benchmarking", total=None)
        report = run_bench(bundle, options,
                           progress=lambda d, t: bar.update(task, completed=d, total=t))
    report.budget_ms = budget_ms
    screen.print(report)
    save_report(report, json=json_out, csv=csv_out, plot=plot_out)
    if plot_out:
        screen.print(f"plot: {plot_out}")
