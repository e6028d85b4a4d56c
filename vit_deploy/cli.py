"""vit-deploy command line: thin click commands over the library."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from vit_deploy.config import POOLS, POS_EMBED_KINDS, VARIANTS
from vit_deploy.contract import OPSET
from vit_deploy.sizes import format_resolution, parse_resolution


class ResolutionType(click.ParamType):
    name = "N|HxW"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, tuple):
            return value
        try:
            return parse_resolution(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


RESOLUTION = ResolutionType()


class PrecisionList(click.ParamType):
    name = "fp32,fp16,int8,int8-static,int4|all"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        from vit_deploy.contract import PRECISIONS

        if isinstance(value, tuple):
            return value
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        if items == ["all"]:
            return PRECISIONS
        bad = [v for v in items if v not in PRECISIONS]
        if bad or not items:
            self.fail(f"unknown precision(s) {bad or [value]}; choose from "
                      f"{', '.join(PRECISIONS)} or all", param, ctx)
        return tuple(dict.fromkeys(items))


def _quant_options(func):
    """Options shared by `quantize` and `export --precision`."""
    for option in reversed([
        click.option("--calib", default=None,
                     help="int8-static calibration: a folder of images, or 'digits' (the "
                          "trained test model's training split)."),
        click.option("--calib-method", type=click.Choice(["minmax", "entropy", "percentile"]),
                     default="minmax", show_default=True),
        click.option("--calib-samples", type=click.IntRange(min=1), default=64, show_default=True),
        click.option("--block-size", type=click.IntRange(min=16), default=32, show_default=True,
                     help="int4: weights per quantisation block (a power of two)."),
        click.option("--exclude", default="", help="Linear layers kept float, by module path "
                     "(comma-separated, e.g. blocks.3.mlp.fc2)."),
        click.option("--float-head", is_flag=True, help="Keep the classifier head float "
                     "(it is quantised by default: measured harmless)."),
        click.option("--max-drop", type=click.FloatRange(min=0), default=None,
                     help="Sensitivity budget: keep the most sensitive layers float until the "
                          "drop is at most this (accuracy points on the trained test model, "
                          "else 1 - cosine)."),
    ]):
        func = option(func)
    return func


def _console() -> Console:
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:  # pipes and CI logs: do not squeeze tables into 80 columns
        console = Console(highlight=False, soft_wrap=True, width=160)
    return console


class _Main(click.Group):
    """Environment failures (disk full, read-only output, ORT refusing a file) end with a
    one-line message and exit code 1, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as e:
            raise click.ClickException(f"{e.strerror or e}"
                                       + (f": {e.filename}" if e.filename else "")) from None
        except Exception as e:
            if type(e).__module__.startswith("onnxruntime"):
                raise click.ClickException(f"onnxruntime: {str(e).splitlines()[0]}") from None
            raise


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vit-deploy")
def main() -> None:
    """Take a Vision Transformer from PyTorch to ONNX Runtime, with proof it still matches."""


@main.command()
@click.option("--model", "variant_name", default="B", show_default=True,
              help=f"Model size ({', '.join(VARIANTS)}), optionally with /PATCH (B/16).")
@click.option("--patch", type=click.IntRange(min=1), default=None,
              help="Patch size (8, 14, 16, 32 for the named sizes). Default 16 (tiny: 8).")
@click.option("--res", "resolution", type=RESOLUTION, default=None,
              help="Deploy resolution, N or HxW: parity is checked there and preprocessing "
                   "resizes to it. Default: the native resolution.")
@click.option("--native-res", type=RESOLUTION, default=None,
              help="Native resolution of a newly built model (its position table). Default 224.")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None,
              help="Weights: a vit-deploy .safetensors (carries its config), a timm state dict "
                   "(.safetensors / .pth / .bin), or a Hugging Face directory (ViT, DeiT, "
                   "DINOv2, DINOv2 with registers). Default: random weights (seeded).")
@click.option("--from", "source", type=click.Choice(["auto", "vit-deploy", "timm", "hf"]),
              default="auto", show_default=True, help="Checkpoint format.")
@click.option("--heads", type=click.IntRange(min=1), default=None,
              help="Attention heads of a timm checkpoint of non-standard width.")
@click.option("--pos-embed", type=click.Choice(POS_EMBED_KINDS), default="learned", show_default=True)
@click.option("--pool", type=click.Choice(POOLS), default="cls", show_default=True)
@click.option("--num-classes", type=click.IntRange(min=1), default=None,
              help="Classes of the head. Default 1000 (tiny: 10).")
@click.option("--static", is_flag=True, help="Freeze --res into the graph (no Resize node).")
@click.option("--no-simplify", is_flag=True, help="Skip onnxsim.")
@click.option("--features", is_flag=True, help="Also output the pooled features ('pooled').")
@click.option("--opset", type=click.IntRange(min=18), default=OPSET, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random weights.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Bundle directory. Default: ./vit-<model><patch>-<res>.")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Class names, one per line (as many as classes).")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True, help="Precisions to add after the fp32 export (see quantize).")
@_quant_options
@click.option("--force", is_flag=True, help="Replace --out even if it is not a bundle, and try "
              "resolutions whose memory estimate exceeds what is available.")
def export(variant_name: str, patch: int | None, resolution: tuple[int, int] | None,
           native_res: tuple[int, int] | None, checkpoint: Path | None, source: str,
           heads: int | None, pos_embed: str, pool: str,
           num_classes: int | None, static: bool, no_simplify: bool, features: bool, opset: int,
           seed: int, out: Path | None, labels_file: Path | None, precisions: tuple[str, ...],
           calib: str | None, calib_method: str, calib_samples: int, block_size: int,
           exclude: str, float_head: bool, max_drop: float | None, force: bool) -> None:
    """Export a ViT to an ONNX bundle that takes any H×W divisible by the patch size.

    Checks ONNX Runtime (CPU) against PyTorch at several resolutions and batch sizes;
    a failing case fails the export and leaves nothing behind.
    """
    from vit_deploy.atomic import OutputExistsError, check_destination
    from vit_deploy.export.checkpoints import CheckpointError
    from vit_deploy.export.checkpoints import load_any
    from vit_deploy.config import parse_variant, variant
    from vit_deploy.export.bundle import ExportOptions, export_bundle
    from vit_deploy.export.onnx import ExportError
    from vit_deploy.export.model import build_model
    from vit_deploy.parity import ParityError
    from vit_deploy.sizes import check_input_size, check_memory

    try:
        size, variant_patch = parse_variant(variant_name)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--model") from None
    overrides: dict[str, Any] = dict(pos_embed=pos_embed, pool=pool, class_token=True)
    if patch is not None or variant_patch is not None:
        overrides["patch_size"] = patch or variant_patch
    if native_res is not None:
        overrides["img_size"] = native_res
    if num_classes is not None:
        overrides["num_classes"] = num_classes
    try:
        cfg = variant(size, **overrides)
    except ValueError as e:
        raise click.UsageError(f"invalid model settings: {e}") from None
    try:
        if checkpoint:
            model, fmt = load_any(checkpoint, source=source, heads=heads, fallback_cfg=cfg)
        else:
            model, fmt = build_model(cfg, seed=seed), None
    except CheckpointError as e:
        raise click.BadParameter(str(e), param_hint="--checkpoint") from None
    cfg = model.cfg
    resolution = resolution or cfg.img_size
    try:
        check_input_size(*resolution, cfg.patch_size)
        if not force:  # parity runs batch 3 at the requested size, in PyTorch and ORT
            check_memory(*resolution, patch=cfg.patch_size, heads=cfg.heads,
                         width_dim=cfg.width, batch=3, prefix=cfg.num_prefix_tokens)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--res") from None
    labels = _read_labels(labels_file, cfg.num_classes) if labels_file else None
    out = out or Path(f"vit-{(cfg.name or size).replace('/', '')}-{_res_label(resolution)}")
    try:
        check_destination(out, force=force)
    except OutputExistsError as e:
        raise click.BadParameter(str(e), param_hint="--out") from None

    console = _console()
    if fmt:
        console.print(f"checkpoint {checkpoint}: {fmt} format")
    console.print(f"exporting {cfg.name or size} ({_params(model) / 1e6:.1f} M parameters, "
                  f"{cfg.pos_embed} positions, {cfg.pool} pooling) at "
                  f"{format_resolution(resolution)}, {'static' if static else 'dynamic'} -> {out}")
    options = ExportOptions(resolution=resolution, static=static, simplify=not no_simplify,
                            opset=opset, features=features, force=force, labels=labels)
    try:
        result = export_bundle(model, out, options=options)
    except ParityError as e:
        console.print(str(e.report))
        console.print(f"[red]export failed: parity did not hold; nothing written to {out}[/]")
        sys.exit(1)
    except (ExportError, OSError) as e:
        console.print(f"[red]export failed: {e}; nothing written to {out}[/]")
        sys.exit(1)
    console.print(str(result.report))
    for note in result.notes:
        console.print(f"note: {note}")
    if any(p != "fp32" for p in precisions):
        _run_precisions(out, precisions, calib=calib, calib_method=calib_method,
                        calib_samples=calib_samples, block_size=block_size, exclude=exclude,
                        float_head=float_head, max_drop=max_drop, force=False)
    from vit_deploy.runtime.manifest import load_manifest

    _print_summary(console, load_manifest(out), out)


def _run_precisions(bundle: Path, precisions: tuple[str, ...], *, calib: str | None,
                    calib_method: str, calib_samples: int, block_size: int, exclude: str,
                    float_head: bool, max_drop: float | None, force: bool) -> None:
    from vit_deploy.precisions import PrecisionOptions, add_precisions, calibration_batches
    from vit_deploy.quantize import QuantizeError, QuantOptions
    from vit_deploy.runtime.manifest import BundleError, load_manifest

    console = _console()
    try:
        manifest = load_manifest(bundle)
        quant = QuantOptions(exclude=tuple(e.strip() for e in exclude.split(",") if e.strip()),
                             calibration=calib_method, block_size=block_size,
                             head=not float_head)
        calibration = (calibration_batches(manifest, calib, limit=calib_samples)
                       if calib and "int8-static" in precisions else None)
        results = add_precisions(bundle, precisions, calibration=calibration, log=console.print,
                                 options=PrecisionOptions(quant=quant, max_drop=max_drop,
                                                          force=force))
    except (BundleError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    except QuantizeError as e:
        console.print(f"[red]quantisation failed: {e}[/]")
        sys.exit(1)
    table = Table("precision", "file", "size", "cosine (min)", "max|Δ|", "accuracy", "result",
                  title="precisions vs fp32", title_justify="left")
    fp32_size = manifest["files"][manifest["models"]["fp32"]]["size"]
    for r in results:
        acc = r.accuracy
        table.add_row(r.precision, r.file, f"{_size(r.size)} ({r.size / fp32_size:.1%})",
                      f"{min(c.cosine for c in r.parity.cases):.5f}",
                      f"{max(c.max_abs for c in r.parity.cases):.2e}",
                      f"{acc['top1']}% (fp32 {acc['fp32_top1']}%)" if acc else "-",
                      "ok" if r.passed else ("FAIL, written (--force)" if force else
                                             "FAIL, not written"))
    console.print(table)
    for r in results:
        for note in r.notes:
            console.print(f"{r.precision}: {note}")
        if r.recipe.get("sensitivity"):
            kept = [x["layer"] for x in r.recipe["sensitivity"]["ranking"] if x.get("kept_float")]
            console.print(f"{r.precision}: kept float by sensitivity: {kept or 'none'}")
    failed = [r.precision for r in results if not r.passed]
    if failed:
        console.print(f"[red]{', '.join(failed)} failed the tolerance policy"
                      f"{' (written anyway: --force)' if force else ' and were not written'}[/]")
        sys.exit(1)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--precision", "precisions", type=PrecisionList(), required=True,
              help="Comma-separated: fp16, int8 (dynamic), int8-static, int4, or all.")
@_quant_options
@click.option("--force", is_flag=True, help="Write precisions even if they fail the policy.")
def quantize(bundle: Path, precisions: tuple[str, ...], calib: str | None, calib_method: str,
             calib_samples: int, block_size: int, exclude: str, float_head: bool,
             max_drop: float | None, force: bool) -> None:
    """Add quantised / fp16 models to BUNDLE, each checked against its fp32 model.

    Only the encoder's linear layers are quantised. A precision outside the tolerance
    policy (DESIGN.md) is not written unless --force, and the exit code is 1.
    """
    _run_precisions(bundle, precisions, calib=calib, calib_method=calib_method,
                    calib_samples=calib_samples, block_size=block_size, exclude=exclude,
                    float_head=float_head, max_drop=max_drop, force=force)


def _csv_list(convert):
    def callback(ctx: click.Context, param: click.Parameter, value: str | None):
        if value is None:
            return None
        try:
            return tuple(convert(v.strip()) for v in value.split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return callback


def _threads(v: str) -> int | None:
    if v == "default":
        return None
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"threads must be positive integers or 'default', got {v!r}")
    return int(v)


def _batch(v: str) -> int:
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"batch sizes must be positive integers, got {v!r}")
    return int(v)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path), required=False)
@click.option("--providers", default="cpu", show_default=True,
              help="Comma-separated providers to compare (cpu, cuda, tensorrt, ...).")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True)
@click.option("--res", "resolutions", default=None, callback=_csv_list(parse_resolution),
              help="Comma-separated resolutions, e.g. 224,448,320x480 (default: the bundle's).")
@click.option("--batch", "batches", default="1", callback=_csv_list(_batch), show_default=True)
@click.option("--threads", default="default", callback=_csv_list(_threads), show_default=True,
              help="Comma-separated intra-op thread counts, or 'default'.")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--runs", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--seconds", type=click.FloatRange(min=0.1), default=None,
              help="Time per group instead of a run count.")
@click.option("--sessions", type=click.IntRange(min=1), default=2, show_default=True,
              help="Fresh sessions per case, used in turn (their medians show the spread).")
@click.option("--baseline", type=click.Choice(["none", "torch"]), default="none",
              show_default=True, help="Add a PyTorch eager fp32 row, interleaved with the rest.")
@click.option("--fallback", is_flag=True, help="Let providers fall back (reported) instead of "
              "being listed as unavailable.")
@click.option("--spinning", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True, help="ORT idle-thread spinning; auto: off when several "
              "sessions are interleaved (idle spinners steal the cores).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PNG: latency against resolution per provider and precision (matplotlib).")
@click.option("--budget-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Say the largest resolution whose p90 at batch 1 stays under this.")
@click.option("--compare", "compare", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              multiple=True, help="Show saved JSON reports side by side (no bundle needed).")
def bench(bundle: Path | None, providers: str, precisions: tuple[str, ...],
          resolutions: tuple[tuple[int, int], ...] | None, batches: tuple[int, ...],
          threads: tuple[int | None, ...], warmup: int, runs: int, seconds: float | None,
          sessions: int, baseline: str, fallback: bool, spinning: str, json_out: Path | None,
          csv_out: Path | None, plot_out: Path | None, budget_ms: float | None,
          compare: tuple[Path, ...]) -> None:
    """Measure latency, throughput, cold start and memory per provider and precision.

    Cases run in one process, interleaved run by run, over several sessions each.
    Every row says which provider actually ran.
    """
    from rich.progress import Progress

    from vit_deploy.atomic import write_bytes_atomic
    from vit_deploy.bench import (TABLE_HEADER, BenchOptions, format_table, load_reports, plot,
                                  run_bench, status_notes, within_budget)
    from vit_deploy.runtime.manifest import BundleError

    console = _console()
    if compare:
        try:
            _print_compare(console, load_reports(compare), [str(p) for p in compare])
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--compare") from None
        return
    if bundle is None:
        raise click.UsageError("give a BUNDLE to measure, or --compare REPORT.json ...")
    try:
        options = BenchOptions(providers=tuple(p for p in providers.split(",") if p.strip()),
                               precisions=precisions, resolutions=resolutions or (),
                               batches=batches, threads=threads, warmup=warmup, runs=runs,
                               seconds=seconds, sessions=sessions,
                               baseline_torch=baseline == "torch", fallback=fallback,
                               spinning={"auto": None, "on": True, "off": False}[spinning])
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("benchmarking", total=None)
            report = run_bench(bundle, options,
                               progress=lambda d, t: bar.update(task, completed=d, total=t))
    except (BundleError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    env = report.environment
    console.print(f"{env.get('cpu')} ({env.get('cores')} cores; {', '.join(env.get('cpu_flags', []))})"
                  f"; GPU: {env.get('gpu') or 'none'}; onnxruntime {env['onnxruntime']}, "
                  f"torch {env.get('torch')}; {options.sessions} session(s) per case, "
                  f"interleaved; ORT spinning "
                  f"{ {None: 'default', True: 'on', False: 'off'}[report.options['ort_spinning']] }")
    table = Table(*TABLE_HEADER)
    for row in format_table(report):
        table.add_row(*row)
    console.print(table)
    for note in status_notes(report):
        console.print(note)
    data = report.to_dict()
    if budget_ms is not None:
        data["budget"] = within_budget(report, budget_ms)
        for b in data["budget"]:
            fits = (f"up to {format_resolution(tuple(b['resolution']))} (p90 {b['p90_ms']:.1f} ms)"
                    if b["resolution"] else "no measured resolution")
            console.print(f"within {budget_ms:g} ms p90 at batch 1 on {b['provider']} "
                          f"{b['precision']}: {fits}")
    if json_out:
        write_bytes_atomic(json_out, json.dumps(data, indent=2).encode())
    if csv_out:
        write_bytes_atomic(csv_out, report.to_csv().encode())
    if plot_out:
        try:
            plot(report, plot_out)
        except ImportError:
            raise click.UsageError("--plot needs matplotlib: pip install 'vit-deploy[plot]'") \
                from None
        console.print(f"plot: {plot_out}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--providers", default="cpu", show_default=True,
              help="Comma-separated providers (cpu, cuda, tensorrt, ...).")
@click.option("--precision", "precisions", type=PrecisionList(), default=None,
              help="Precisions to check (default: every one in the bundle).")
@click.option("--res", "resolutions", default=None, callback=_csv_list(parse_resolution),
              help="Comma-separated resolutions (default: the deploy and native sizes).")
@click.option("--batch", "batches", default="1,4", callback=_csv_list(_batch), show_default=True)
@click.option("--require", is_flag=True, help="A provider that is not available is a failure.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def check(bundle: Path, providers: str, precisions: tuple[str, ...] | None,
          resolutions: tuple[tuple[int, int], ...] | None, batches: tuple[int, ...],
          require: bool, json_out: Path | None, md_out: Path | None) -> None:
    """Check a bundle against PyTorch on every provider × precision × size × batch.

    Also batch independence and determinism per provider and precision. Exits 1 if
    any case fails (or, with --require, if a provider is not available here).
    """
    from vit_deploy.atomic import write_bytes_atomic
    from vit_deploy.check import CheckOptions, run_check
    from vit_deploy.runtime.manifest import BundleError

    console = _console()
    try:
        options = CheckOptions(providers=tuple(p for p in providers.split(",") if p.strip()),
                               precisions=precisions or (), resolutions=resolutions or (),
                               batches=batches, require=require)
        with console.status("checking") as status:
            report = run_check(bundle, options,
                               progress=lambda what: status.update(f"checking {what}"))
    except (BundleError, ValueError, ImportError) as e:
        raise click.UsageError(str(e)) from None
    table = Table("case", "asked → ran on", "precision", "max|Δ|", "max rel Δ", "cosine",
                  "top-1", "CPU-fallback nodes", "result",
                  title=f"{bundle} vs {report.reference}", title_justify="left")
    for c in report.parity.cases:
        table.add_row(c.label, c.provider, c.precision, f"{c.max_abs:.2e}", f"{c.max_rel:.2e}",
                      f"{c.cosine:.6f}", f"{c.top1_agree:.0%}", str(c.fallback_nodes),
                      "ok" if c.passed else "[red]FAIL[/]")
    for k in report.parity.checks:
        table.add_row(k.name, k.subject.split(":")[0], k.subject.split(":")[1], f"{k.value:.2e}",
                      f"limit {k.limit:.1e}", "", "", "", "ok" if k.passed else "[red]FAIL[/]")
    console.print(table)
    for provider, why in report.unavailable.items():
        console.print(f"{provider}: not available here{' (required)' if require else ''}: {why}")
    if json_out:
        write_bytes_atomic(json_out, report.to_json().encode())
    if md_out:
        write_bytes_atomic(md_out, report.to_markdown().encode())
    failures = len(report.parity.failures) + (len(report.unavailable) if require else 0)
    console.print(f"check: {'PASS' if report else f'FAIL ({failures} failing)'}")
    if not report:
        sys.exit(1)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Model repository directory to write.")
@click.option("--precision", default="fp32", show_default=True)
@click.option("--name", default=None, help="Model name in the repository (default: bundle name).")
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--instances", default="cpu:1", show_default=True, help="e.g. cpu:2,gpu:1")
@click.option("--dynamic-batching-us", type=click.IntRange(min=0), default=1000,
              show_default=True, help="Triton's max queue delay; batch-coupled precisions "
              "(dynamic int8) get none.")
@click.option("--accelerator", type=click.Choice(["none", "cuda", "tensorrt", "tensorrt-fp16"]),
              default="none", show_default=True, help="GPU execution accelerator setting.")
@click.option("--force", is_flag=True, help="Replace --out even if it is not ours.")
def triton(bundle: Path, out: Path, precision: str, name: str | None, max_batch: int,
           instances: str, dynamic_batching_us: int, accelerator: str, force: bool) -> None:
    """Write a Triton Inference Server model repository (ONNX Runtime backend)."""
    from vit_deploy.atomic import OutputExistsError
    from vit_deploy.runtime.manifest import BundleError
    from vit_deploy.triton import parse_instances, triton_repository

    try:
        repo, notes = triton_repository(
            bundle, out, precision=precision, name=name, max_batch=max_batch,
            instances=parse_instances(instances), dynamic_batching_us=dynamic_batching_us,
            accelerator=None if accelerator == "none" else accelerator, force=force)
    except (BundleError, ValueError, OutputExistsError) as e:
        raise click.UsageError(str(e)) from None
    console = _console()
    model = name or bundle.name
    console.print(f"wrote {repo}/{model}/config.pbtxt and {repo}/{model}/1/model.onnx")
    for note in notes:
        console.print(f"note: {note}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--provider", default="cpu", show_default=True)
@click.option("--precision", default="fp32", show_default=True)
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--max-wait-ms", type=click.FloatRange(min=0), default=5.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=1), default=5, show_default=True)
def serve(bundle: Path, host: str, port: int, provider: str, precision: str, max_batch: int,
          max_wait_ms: float, top_k: int) -> None:
    """Serve BUNDLE over HTTP: POST /predict, GET /health, /metadata, /metrics."""
    from vit_deploy.runtime import BundleError, ProviderError, ViTSession

    try:
        import uvicorn

        from vit_deploy.server import make_app
    except ImportError:
        raise click.UsageError("serve needs FastAPI and uvicorn: pip install 'vit-deploy[serve]'") \
            from None
    try:
        session = ViTSession(bundle, provider=provider, precision=precision)
    except (BundleError, FileNotFoundError, ProviderError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    _console().print(f"serving {bundle} ({precision}, {session.providers[0]}) on "
                     f"http://{host}:{port}")
    uvicorn.run(make_app(session, max_batch=max_batch, max_wait_ms=max_wait_ms, top_k=top_k),
                host=host, port=port, log_level="warning")


def _print_compare(console: Console, reports: list[dict[str, Any]], names: list[str]) -> None:
    keys: dict[tuple, dict[int, dict[str, Any]]] = {}
    for i, rep in enumerate(reports):
        for c in rep["cases"]:
            key = (c["requested"], c["precision"], tuple(c["resolution"]), c["batch"], c["threads"])
            keys.setdefault(key, {})[i] = c
    table = Table("asked", "precision", "res", "batch", "threads",
                  *[f"{Path(n).stem}: p50 ms (ran on)" for n in names])
    for (req, prec, res, batch, threads), by in keys.items():
        cells = [f"{by[i]['p50_ms']:.2f} ({by[i]['provider']})" if i in by and "p50_ms" in by[i]
                 else (by[i]["status"][:30] if i in by else "-") for i in range(len(reports))]
        table.add_row(req, prec, format_resolution(res), str(batch), str(threads or "default"),
                      *cells)
    for n, rep in zip(names, reports):
        env = rep.get("environment", {})
        console.print(f"{n}: {env.get('cpu')} / GPU {env.get('gpu') or 'none'} / onnxruntime "
                      f"{env.get('onnxruntime')}")
    console.print(table)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--no-verify", is_flag=True, help="Skip the sha256 check of the files.")
def info(bundle: Path, as_json: bool, no_verify: bool) -> None:
    """Describe a bundle: model, inputs, files, parity, tool versions."""
    from vit_deploy.runtime.manifest import BundleError, load_manifest

    try:
        manifest = load_manifest(bundle, verify=not no_verify)
    except BundleError as e:
        raise click.BadParameter(str(e), param_hint="BUNDLE") from None
    if as_json:
        click.echo(json.dumps(manifest, indent=2))
        return
    _print_summary(_console(), manifest, bundle)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--provider", default="cpu", show_default=True,
              help="Provider alias or list in preference order (cpu, cuda, tensorrt, ...).")
@click.option("--fallback", is_flag=True, help="Allow falling back to the next provider.")
@click.option("--precision", default="fp32", show_default=True)
@click.option("--top-k", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--resize", type=click.Choice(["shorter_side_center_crop", "patch_multiple"]),
              default=None, help="Override the manifest's resize rule.")
@click.option("--res", "resolution", type=RESOLUTION, default=None,
              help="Override the manifest's resolution (dynamic bundles take any multiple "
                   "of the patch size).")
@click.option("--threads", type=click.IntRange(min=1), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def predict(bundle: Path, images: tuple[Path, ...], provider: str, fallback: bool,
            precision: str, top_k: int, resize: str | None, resolution: tuple[int, int] | None,
            threads: int | None, as_json: bool) -> None:
    """Classify IMAGES with a bundle (no torch needed)."""
    from vit_deploy.runtime import (BundleError, ImageError, ProviderError, RuntimeOptions,
                                    ViTSession)
    from vit_deploy.runtime.providers import short_name

    try:
        with warnings.catch_warnings():  # a fallback is reported below, in plain words
            warnings.simplefilter("ignore", RuntimeWarning)
            session = ViTSession(bundle, provider=provider, precision=precision,
                                 fallback=fallback, options=RuntimeOptions(threads=threads))
    except (BundleError, FileNotFoundError) as e:
        raise click.BadParameter(str(e), param_hint="BUNDLE") from None
    except (ProviderError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint="--provider") from None
    with session:
        try:
            pre = session.preprocess(resize=resize, resolution=resolution)
            predictions = session.predict(list(images), top_k=top_k, preprocess=pre)
        except (ImageError, ValueError) as e:
            raise click.BadParameter(str(e), param_hint="IMAGES") from None
        ran_on = [short_name(p) for p in session.providers]
    if as_json:
        click.echo(json.dumps({"providers": ran_on, "precision": precision,
                               "predictions": [p.to_dict() for p in predictions]}, indent=2))
        return
    console = _console()
    console.print(f"ran on {ran_on[0]} ({precision})" + (f"; {session.fallback_reason}"
                                                        if session.fallback_reason else ""))
    for p in predictions:
        table = Table("rank", "class", "label", "probability", title=f"{p.source} "
                      f"({format_resolution(p.input_size)})", title_justify="left")
        for rank, c in enumerate(p.top, 1):
            table.add_row(str(rank), str(c.index), c.label or "", f"{c.probability:.4f}")
        console.print(table)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def providers(as_json: bool) -> None:
    """What this onnxruntime lists, and whether a session really runs on each here."""
    import onnxruntime as ort

    from vit_deploy.runtime.providers import available, probe

    results = [probe(name) for name in available()]
    if as_json:
        click.echo(json.dumps({"onnxruntime": ort.__version__, "device": ort.get_device(),
                               "providers": [r.__dict__ | {"alias": r.alias} for r in results]},
                              indent=2))
        return
    table = Table("provider", "alias", "usable here", title=f"onnxruntime {ort.__version__}",
                  title_justify="left")
    for r in results:
        table.add_row(r.name, r.alias, "yes" if r.usable else "no (see below)")
    console = _console()
    console.print(table)
    for r in results:
        if not r.usable:
            console.print(f"{r.alias}: {r.reason}")


def _read_labels(path: Path, num_classes: int) -> list[str]:
    try:
        labels = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                  if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {str(path)!r}: {e}", param_hint="--labels") from None
    if len(labels) != num_classes:
        raise click.BadParameter(f"{str(path)!r} has {len(labels)} labels, the model has "
                                 f"{num_classes} classes", param_hint="--labels")
    return labels


def _obj(d: Any, key: str) -> dict[str, Any]:
    """d[key] if it is an object, else {} (display code over optional manifest fields)."""
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


def _print_summary(console: Console, manifest: dict[str, Any], path: Path) -> None:
    """Readable manifest. Required fields are validated by load_manifest; optional ones
    (export, parity, precisions) are shown when they are well formed."""
    cfg, io, pre, exp = manifest["config"], manifest["io"], manifest["preprocess"], _obj(
        manifest, "export")
    inp = io["inputs"][0]
    console.print(f"bundle {path}: {cfg.get('name') or 'ViT'} width {cfg['width']} depth "
                  f"{cfg.get('depth', '?')} heads {cfg['heads']} patch {cfg['patch_size']}, "
                  f"native {format_resolution(tuple(cfg['img_size']))}, {cfg['num_classes']} "
                  f"classes")
    console.print(f"input {inp['name']} {inp['shape']} {inp.get('dtype', '?')}"
                  + (f" ({io['dim_rule']})" if io.get("dim_rule") else " (static)")
                  + f"; outputs {[o['name'] for o in io['outputs']]}; preprocessing "
                  f"{pre.get('resize', '?')} to {format_resolution(tuple(pre['resolution']))}")
    table = Table("file", "role", "size", "nodes", "sha256")
    for name, entry in manifest["files"].items():
        role = str(entry.get("role", ""))
        recipe = _obj(_obj(_obj(manifest, "precisions"), role.removeprefix("model:")), "recipe")
        nodes = recipe.get("nodes") or (exp.get("nodes", "") if role == "model:fp32" else "")
        table.add_row(name, role, _size(entry["size"]), str(nodes), entry["sha256"][:12])
    console.print(table)
    simp = _obj(exp, "simplify")
    if simp.get("requested"):
        console.print(f"onnxsim: {simp.get('nodes_before')} -> {simp.get('nodes_after', '?')} "
                      f"nodes, {'kept' if simp.get('kept') else 'discarded'}")
    parity = _obj(manifest, "parity")
    cases = [c for c in parity.get("cases", []) if isinstance(c, dict)] \
        if isinstance(parity.get("cases"), list) else []
    try:
        worst = max(float(c["max_abs"]) for c in cases)
        cos = min(float(c["cosine"]) for c in cases)
        providers = sorted({str(c["provider"]) for c in cases})
    except (KeyError, TypeError, ValueError):  # no cases, or not the shape we write
        cases = []
    if cases:
        console.print(f"parity: {'PASS' if parity.get('passed') else 'FAIL'} on "
                      f"{len(providers)} provider(s) {providers}, {len(cases)} cases, worst "
                      f"max|Δ| {worst:.2e}, min cosine {cos:.7f}")
    if "total_s" in exp:
        console.print(f"export took {exp['total_s']} s (torch.onnx.export "
                      f"{exp.get('export_s', '?')} s)")


def _res_label(hw: tuple[int, int]) -> str:
    return str(hw[0]) if hw[0] == hw[1] else format_resolution(hw)


def _params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


if __name__ == "__main__":
    main()
