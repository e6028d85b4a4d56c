"""vit-deploy command line: options and calls. The work is in the library; reports render
themselves (rich's `__rich__`); errors map to exit codes in one place (`_Main`)."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import click

from vit_deploy.runtime.config import POOLS, POS_EMBED_KINDS, VARIANTS
from vit_deploy.runtime.contract import OPSET, PRECISIONS, TARGETS as TARGET_NAMES
from vit_deploy.runtime.sizes import format_resolution, parse_resolution

MAX_THREADS = 256  # more intra-op threads than this is a typo, not a machine
MAX_BATCH = 4096
MAX_SEED = 2**32 - 1
MAX_PATCH = 1024  # pixels per patch side


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


def _csv_list(convert):
    def callback(ctx: click.Context, param: click.Parameter, value: str | None):
        if value is None:
            return None
        try:
            return tuple(convert(v.strip()) for v in value.split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return callback


def _count(what: str, high: int, default: str | None = None):
    def convert(v: str) -> int | None:
        if default is not None and v == default:
            return None
        if not v.isdigit() or not 1 <= int(v) <= high:
            raise ValueError(f"{what} must be positive integers up to {high}"
                             + (f" or '{default}'" if default else "") + f", got {v[:20]!r}")
        return int(v)
    return convert


def _floats(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}") from None


def _quant_options(func):
    """Options shared by `quantize` and `export --precision`."""
    for option in reversed([
        click.option("--calib", default=None,
                     help="int8-static calibration: a folder of images, or 'digits' (the "
                          "trained test model's training split)."),
        click.option("--calib-method", type=click.Choice(["minmax", "entropy", "percentile"]),
                     default="minmax", show_default=True),
        click.option("--calib-samples", type=click.IntRange(1, 100_000), default=64,
                     show_default=True),
        click.option("--block-size", type=click.IntRange(16, 4096), default=32,
                     show_default=True, help="int4: weights per quantisation block (a power "
                     "of two)."),
        click.option("--exclude", default="", help="Linear layers kept float, by module path "
                     "(comma-separated, e.g. blocks.3.mlp.fc2)."),
        click.option("--int8-cpu", type=click.Choice(["any", "vnni"]), default="any",
                     show_default=True, help="CPUs the int8 files must be exact on. any: "
                     "7-bit weights, exact everywhere; vnni: 8-bit weights, for x86 with "
                     "AVX-512 VNNI / AVX-VNNI / AMX or ARM64 only (x86 with AVX2 only "
                     "saturates them; the runtime warns there)."),
        click.option("--float-head", is_flag=True, help="Keep the classifier head float "
                     "(it is quantised by default: measured harmless)."),
        click.option("--max-drop", type=click.FloatRange(min=0), default=None,
                     help="Sensitivity budget: keep the most sensitive layers float until the "
                          "drop is at most this (accuracy points with --eval-set, else "
                          "1 - cosine)."),
        click.option("--eval-set", type=click.Choice(["digits"]), default=None,
                     help="Also measure top-1 accuracy on a labelled held-out set shipped "
                          "with the package (digits: the trained test model's)."),
    ]):
        func = option(func)
    return func


def _quiet_option(func):
    return click.option("--quiet", "-q", is_flag=True,
                        help="No progress lines (for scripts).")(func)


def _console():
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:  # pipes and CI logs: do not squeeze tables into 80 columns
        console = Console(highlight=False, soft_wrap=True, width=160)
    return console


class _Main(click.Group):
    """Every failure ends with a one-line message, never a traceback: bad input (a bundle,
    image, checkpoint or flag we refuse) exits 2, a failed check or environment failure
    (disk full, a busy bundle, ORT refusing a file) exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        from vit_deploy.runtime.swap import BusyError, OutputExistsError
        from vit_deploy.parity import ParityError

        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except ParityError as e:
            _console().print(e.report)
            _fail(1, "parity did not hold; nothing was written")
        except OutputExistsError as e:
            _fail(2, str(e))
        except BusyError as e:
            _fail(1, str(e))
        except OSError as e:
            _fail(1, f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        except MemoryError:
            _fail(1, "out of memory; try a smaller size or batch")
        except (ValueError, OverflowError, ImportError) as e:  # BundleError, ImageError, ...
            _fail(2, str(e).splitlines()[0] if str(e) else type(e).__name__)
        except Exception as e:
            if type(e).__module__.startswith("onnxruntime") or type(e).__name__ in (
                    "ProviderError", "QuantizeError", "ExportError"):
                _fail(1, f"{str(e).splitlines()[0]}")
            raise


def _refuse_clobber(outputs: dict[str, Path | None], *, bundles: Any = (),
                    inputs: Any = ()) -> None:
    """Each output file the user named (option -> path) must not land in a bundle the
    command reads or on one of its inputs (`atomic.refuse_clobber`: exit 2 naming it)."""
    from vit_deploy.atomic import refuse_clobber

    for option, path in outputs.items():
        if path is not None:
            refuse_clobber(path, option=option, bundles=bundles, inputs=inputs)


def _fail(code: int, message: str) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vit-deploy")
def main() -> None:
    """Take a Vision Transformer from PyTorch to ONNX Runtime, with proof it still matches."""


@main.command()
@click.option("--model", "variant_name", default="B", show_default=True,
              help=f"Model size ({', '.join(VARIANTS)}), optionally with /PATCH (B/16).")
@click.option("--patch", type=click.IntRange(min=1, max=MAX_PATCH), default=None,
              help="Patch size (8, 14, 16, 32 for the named sizes). Default 16 (tiny: 8). "
                   "With a --checkpoint of another patch size, its patch embedding is "
                   "PI-resized (FlexiViT) and its position table resampled.")
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
@click.option("--heads", type=click.IntRange(1, 1024), default=None,
              help="Attention heads of a timm checkpoint of non-standard width.")
@click.option("--pos-embed", type=click.Choice(POS_EMBED_KINDS), default="learned", show_default=True)
@click.option("--pool", type=click.Choice(POOLS), default="cls", show_default=True)
@click.option("--num-classes", type=click.IntRange(0, 1_000_000), default=None,
              help="Classes of the head; 0: a backbone without one. Default 1000 (tiny: 10).")
@click.option("--static", is_flag=True, help="Freeze --res into the graph (no Resize node).")
@click.option("--no-simplify", is_flag=True, help="Skip onnxsim.")
@click.option("--features", is_flag=True, help="Also output the pooled features ('pooled').")
@click.option("--outputs", "outputs", default=None, metavar="NAMES",
              help="Comma-separated outputs, in order: logits, pooled, patch_tokens "
                   "[batch, width, grid_h, grid_w], class_token, register_tokens. Default: "
                   "logits (a model without classifier: pooled,patch_tokens).")
@click.option("--layers", default=None, metavar="BLOCKS",
              help="Also output the patch tokens after these blocks (1-based, e.g. 3,6,9,12) "
                   "as layer_N [batch, width, grid_h, grid_w], for DPT-style heads.")
@click.option("--merge-tokens", "merge", default=None, metavar="R|r1,r2,...",
              help="Token merging (ToMe) in the graph: merge R tokens in every block, or one "
                   "number per block. Faster, slightly less exact; classifier outputs only.")
@click.option("--layer-norm/--no-layer-norm", default=True, show_default=True,
              help="Pass --layers through the final norm (DINOv2 / Dinov2Backbone) or not "
                   "(Hugging Face hidden_states).")
@click.option("--opset", type=click.IntRange(18, 30), default=OPSET, show_default=True)
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="Seed of random weights.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Bundle directory. Default: ./vit-<model><patch>-<res>.")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Class names, one per line (as many as classes).")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True, help="Precisions to add after the fp32 export (see quantize).")
@_quant_options
@click.option("--force", is_flag=True, help="Write into --out even if vit-deploy did not write "
              "it (its files are kept), and try resolutions whose memory estimate exceeds "
              "what is available.")
@_quiet_option
def export(variant_name: str, patch: int | None, resolution: tuple[int, int] | None,
           native_res: tuple[int, int] | None, checkpoint: Path | None, source: str,
           heads: int | None, pos_embed: str, pool: str,
           num_classes: int | None, static: bool, no_simplify: bool, features: bool,
           outputs: str | None, layers: str | None, layer_norm: bool, merge: str | None,
           opset: int, seed: int, out: Path | None, labels_file: Path | None, precisions: tuple[str, ...],
           force: bool, quiet: bool, **quant: Any) -> None:
    """Export a ViT to an ONNX bundle that takes any H×W divisible by the patch size.

    Checks ONNX Runtime (CPU) against PyTorch at several resolutions and batch sizes;
    a failing case fails the export and leaves nothing behind.
    """
    from vit_deploy.runtime.config import config_from_flags
    from vit_deploy.export.bundle import (ExportOptions, default_bundle_name, export_bundle,
                                          model_from_flags, validate_request)
    from vit_deploy.outputs import parse_layers, parse_names
    from vit_deploy.progress import steps
    from vit_deploy.runtime.manifest import load_manifest

    labels = _read_labels(labels_file) if labels_file else None
    options = ExportOptions(resolution=resolution, static=static, simplify=not no_simplify,
                            opset=opset, features=features, force=force, labels=labels,
                            allow_large=force, outputs=parse_names(outputs),
                            layers=parse_layers(layers), layer_norm=layer_norm)
    if checkpoint is None:  # the flags give the config: refuse (memory guard) before building
        validate_request(config_from_flags(variant_name, patch=patch, native_res=native_res,
                                           num_classes=num_classes, pos_embed=pos_embed,
                                           pool=pool), options)
    model, fmt = model_from_flags(variant_name, patch=patch, native_res=native_res,
                                  num_classes=num_classes, pos_embed=pos_embed, pool=pool,
                                  seed=seed, checkpoint=checkpoint, source=source, heads=heads,
                                  merge=merge)
    cfg = model.cfg
    resolution = validate_request(cfg, options)  # fail fast, before minutes of work
    out = out or Path(default_bundle_name(cfg, resolution))
    console = _console()
    if not quiet:
        console.print(f"{f'checkpoint {checkpoint}: {fmt} format; ' if fmt else ''}exporting "
                      f"{cfg.name or 'ViT'} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}"
                      f" M parameters, {cfg.pos_embed} positions, {cfg.pool} pooling) at "
                      f"{format_resolution(resolution)}, {'static' if static else 'dynamic'} "
                      f"-> {out}")
    with steps(quiet=quiet, title="exporting") as progress:
        result = export_bundle(model, out, options=options, progress=progress)
    console.print(result.report)
    for note in result.notes:
        console.print(f"note: {note}")
    if any(p != "fp32" for p in precisions):
        _add_precisions(out, precisions, force=False, quiet=quiet, **quant)
    from vit_deploy.info import BundleSummary

    console.print(BundleSummary(load_manifest(out), str(out)))


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--precision", "precisions", type=PrecisionList(), required=True,
              help="Comma-separated: fp16, int8 (dynamic), int8-static, int4, or all.")
@_quant_options
@click.option("--force", is_flag=True, help="Write precisions even if they fail the policy.")
@_quiet_option
def quantize(bundle: Path, precisions: tuple[str, ...], force: bool, quiet: bool,
             **quant: Any) -> None:
    """Add quantised / fp16 models to BUNDLE, each checked against its fp32 model.

    Only the encoder's linear layers are quantised. A precision outside the tolerance
    policy (DESIGN.md) is not written unless --force, and the exit code is 1. Files in
    BUNDLE that vit-deploy did not write are kept.
    """
    _add_precisions(bundle, precisions, force=force, quiet=quiet, **quant)


def _add_precisions(bundle: Path, precisions: tuple[str, ...], *, force: bool, quiet: bool,
                    calib: str | None, calib_method: str, calib_samples: int, block_size: int,
                    exclude: str, float_head: bool, max_drop: float | None,
                    eval_set: str | None, int8_cpu: str) -> None:
    from vit_deploy.precisions import PrecisionOptions, add_precisions, calibration_batches
    from vit_deploy.progress import steps
    from vit_deploy.quantize import QuantOptions
    from vit_deploy.runtime.manifest import load_manifest

    quant = QuantOptions(exclude=tuple(e.strip() for e in exclude.split(",") if e.strip()),
                         calibration=calib_method, block_size=block_size, head=not float_head,
                         cpu=int8_cpu)
    options = PrecisionOptions(quant=quant, max_drop=max_drop, force=force, eval_set=eval_set)
    calibration = (calibration_batches(load_manifest(bundle), calib, limit=calib_samples)
                   if calib and "int8-static" in precisions else None)
    with steps(quiet=quiet, title="quantising") as progress:
        report = add_precisions(bundle, precisions, calibration=calibration, options=options,
                                progress=progress)
    _console().print(report)
    if not report:
        sys.exit(1)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path), required=False)
@click.option("--providers", default="cpu", show_default=True,
              help="Comma-separated providers to compare (cpu, cuda, tensorrt, ...).")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True)
@click.option("--res", "resolutions", default=None, callback=_csv_list(parse_resolution),
              help="Comma-separated resolutions, e.g. 224,448,320x480 (default: the bundle's).")
@click.option("--batch", "batches", default="1", show_default=True,
              callback=_csv_list(_count("batch sizes", MAX_BATCH)))
@click.option("--threads", default="default", show_default=True,
              callback=_csv_list(_count("threads", MAX_THREADS, default="default")),
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
@click.option("--target", "bench_target", type=click.Choice(TARGET_NAMES), default=None,
              help="Also measure this edge target's bucket graphs beside the dynamic graph, at "
                   "the same sizes (default sizes: its buckets).")
@click.option("--io-binding", is_flag=True, help="Bind inputs and outputs to the provider's "
              "device (CUDA).")
def bench(bundle: Path | None, providers: str, precisions: tuple[str, ...],
          resolutions: tuple[tuple[int, int], ...] | None, batches: tuple[int, ...],
          threads: tuple[int | None, ...], warmup: int, runs: int, seconds: float | None,
          sessions: int, baseline: str, fallback: bool, spinning: str, json_out: Path | None,
          csv_out: Path | None, plot_out: Path | None, budget_ms: float | None,
          compare: tuple[Path, ...], bench_target: str | None, io_binding: bool) -> None:
    """Measure latency, throughput, cold start and memory per provider and precision.

    Cases run in one process, interleaved run by run, over several sessions each.
    Every row says which provider actually ran.
    """
    from rich.progress import Progress

    from vit_deploy.runtime.files import write_bytes_atomic
    from vit_deploy.bench import BenchOptions, compare_reports, plot, run_bench, within_budget
    from vit_deploy.runtime.manifest import dumps_strict

    _refuse_clobber({"--json": json_out, "--csv": csv_out, "--plot": plot_out},
                    bundles=[bundle] if bundle else [], inputs=compare)
    console = _console()
    if compare:
        console.print(compare_reports(compare))
        return
    if bundle is None:
        raise click.UsageError("give a BUNDLE to measure, or --compare REPORT.json ...")
    options = BenchOptions(providers=tuple(p for p in providers.split(",") if p.strip()),
                           precisions=precisions, resolutions=resolutions or (),
                           batches=batches, threads=threads, warmup=warmup, runs=runs,
                           seconds=seconds, sessions=sessions,
                           baseline_torch=baseline == "torch", fallback=fallback,
                           spinning={"auto": None, "on": True, "off": False}[spinning],
                           target=bench_target, io_binding=io_binding)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("benchmarking", total=None)
        report = run_bench(bundle, options,
                           progress=lambda d, t: bar.update(task, completed=d, total=t))
    console.print(report)
    data = report.to_dict()
    if budget_ms is not None:
        data["budget"] = within_budget(report, budget_ms)
        for b in data["budget"]:
            fits = (f"up to {format_resolution(tuple(b['resolution']))} (p90 {b['p90_ms']:.1f} ms)"
                    if b["resolution"] else "no measured resolution")
            console.print(f"within {budget_ms:g} ms p90 at batch 1 on {b['provider']} "
                          f"{b['precision']}: {fits}")
    if json_out:
        write_bytes_atomic(json_out, dumps_strict(data).encode())
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
@click.option("--batch", "batches", default="1,4", show_default=True,
              callback=_csv_list(_count("batch sizes", MAX_BATCH)))
@click.option("--require", is_flag=True, help="A provider that is not available is a failure.")
@click.option("--no-buckets", is_flag=True, help="Skip the edge targets' bucket graphs "
              "(checked by default, each at its own size).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@_quiet_option
def check(bundle: Path, providers: str, precisions: tuple[str, ...] | None,
          resolutions: tuple[tuple[int, int], ...] | None, batches: tuple[int, ...],
          require: bool, json_out: Path | None, md_out: Path | None, quiet: bool,
          no_buckets: bool = False) -> None:
    """Check a bundle against PyTorch on every provider × precision × size × batch.

    Also batch independence and determinism per provider and precision. Exits 1 if
    any case fails (or, with --require, if a provider is not available here).
    """
    from vit_deploy.runtime.files import write_bytes_atomic
    from vit_deploy.check import CheckOptions, run_check
    from vit_deploy.progress import steps

    _refuse_clobber({"--json": json_out, "--markdown": md_out}, bundles=[bundle])

    options = CheckOptions(providers=tuple(p for p in providers.split(",") if p.strip()),
                           precisions=precisions or (), resolutions=resolutions or (),
                           batches=batches, require=require, targets=not no_buckets)
    with steps(quiet=quiet, title="checking") as progress:
        report = run_check(bundle, options, progress=progress)
    _console().print(report)
    if json_out:
        write_bytes_atomic(json_out, report.to_json().encode())
    if md_out:
        write_bytes_atomic(md_out, report.to_markdown().encode())
    if not report:
        sys.exit(1)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Model repository directory to write.")
@click.option("--precision", default="fp32", show_default=True)
@click.option("--name", default=None, help="Model name in the repository (default: bundle name).")
@click.option("--max-batch", type=click.IntRange(1, MAX_BATCH), default=8, show_default=True)
@click.option("--instances", default="cpu:1", show_default=True, help="e.g. cpu:2,gpu:1")
@click.option("--dynamic-batching-us", type=click.IntRange(0, 10_000_000), default=1000,
              show_default=True, help="Triton's max queue delay; batch-coupled precisions "
              "(dynamic int8) get none.")
@click.option("--accelerator", type=click.Choice(["none", "cuda", "tensorrt", "tensorrt-fp16"]),
              default="none", show_default=True, help="GPU execution accelerator setting.")
@click.option("--force", is_flag=True, help="Write into --out even if vit-deploy did not "
              "write it (its files are kept).")
def triton(bundle: Path, out: Path, precision: str, name: str | None, max_batch: int,
           instances: str, dynamic_batching_us: int, accelerator: str, force: bool) -> None:
    """Write a Triton Inference Server model repository (ONNX Runtime backend)."""
    from vit_deploy.triton import parse_instances, triton_repository

    repo, name, notes = triton_repository(
        bundle, out, precision=precision, name=name, max_batch=max_batch,
        instances=parse_instances(instances), dynamic_batching_us=dynamic_batching_us,
        accelerator=None if accelerator == "none" else accelerator, force=force)
    console = _console()
    console.print(f"wrote {repo}/{name}/config.pbtxt and {repo}/{name}/1/model.onnx")
    for note in notes:
        console.print(f"note: {note}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Site directory to write.")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True, help="Models the site carries, e.g. int8,fp32 (the first is "
              "the page's default).")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
              help="WebAssembly threads (default: onnxruntime-web's, min(4, cores / 2)); more "
                   "than one needs a cross-origin isolated page (COOP/COEP headers).")
@click.option("--force", is_flag=True, help="Write into --out even if vit-deploy did not "
              "write it (its files are kept).")
@click.option("--serve", "serve_it", is_flag=True, help="Then serve the site locally with the "
              "COOP/COEP headers and MIME types it needs, until Ctrl-C.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="With --serve: interface to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="With --serve: port (0: any free one).")
@click.option("--no-isolation", is_flag=True, help="With --serve: send no COOP/COEP headers "
              "(to see the one-thread fallback a plain host gives).")
def web(bundle: Path, out: Path, precisions: tuple[str, ...], threads: int | None, force: bool,
        serve_it: bool, host: str, port: int, no_isolation: bool) -> None:
    """Write a static site that runs BUNDLE in the browser (onnxruntime-web: WebGPU when
    the browser offers it, else WebAssembly): a demo page, vit-deploy.mjs, the model(s)."""
    from vit_deploy.web import serve_site, write_site

    result = write_site(bundle, out, precisions=precisions, threads=threads, force=force)
    console = _console()
    console.print(result)
    if serve_it:
        def ready(url: str) -> None:
            console.print(f"serving {out} on {url}" + (" (no COOP/COEP: one thread)"
                                                       if no_isolation else ""))
            sys.stdout.flush()
        serve_site(out, host, port, isolation=not no_isolation, on_ready=ready)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--provider", default="cpu", show_default=True)
@click.option("--precision", default="fp32", show_default=True)
@click.option("--max-batch", type=click.IntRange(1, MAX_BATCH), default=8, show_default=True)
@click.option("--max-wait-ms", type=click.FloatRange(0, 60_000), default=5.0, show_default=True)
@click.option("--top-k", type=click.IntRange(1, 1_000_000), default=5, show_default=True)
@click.option("--name", default=None, help="Model name on the v2 endpoints (default: the "
              "bundle name, as `vit-deploy triton` names it).")
def serve(bundle: Path, host: str, port: int, provider: str, precision: str, max_batch: int,
          max_wait_ms: float, top_k: int, name: str | None) -> None:
    """Serve BUNDLE over HTTP: POST /predict, the Open Inference Protocol (KServe v2:
    /v2/models/NAME/infer, ...), GET /health, /metadata, /stats, /metrics (Prometheus)."""
    from vit_deploy.runtime import ViTSession
    from vit_deploy.triton import model_name

    try:
        from vit_deploy.serve.app import make_app
        from vit_deploy.serve.run import serve as run_server
    except ImportError:
        raise click.UsageError("serve needs FastAPI, uvicorn and prometheus-client: "
                               "pip install 'vit-deploy[serve]'") from None
    name = model_name(name, bundle)
    session = ViTSession(bundle, provider=provider, precision=precision)
    app = make_app(session, max_batch=max_batch, max_wait_ms=max_wait_ms, top_k=top_k,
                   model_name=name)
    run_server(app, host, port, on_ready=lambda url: _console().print(
        f"serving {bundle} as model {name!r} ({precision}, {session.providers[0]}) on {url}"))


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--target", "target_name", type=click.Choice(TARGET_NAMES), required=True,
              help="cpu / mobile / web: fp32 (+ int8 if the bundle has it); npu: int8-static "
                   "(QDQ); tensorrt: fp32 and fp16. mobile and web also get ORT format.")
@click.option("--buckets", required=True, help="Resolution buckets, N or HxW, comma-separated "
              "(e.g. 224,256x320,448): one static graph each per precision.")
@click.option("--batch", type=click.IntRange(1, 64), default=1, show_default=True,
              help="The fixed batch of every graph.")
@click.option("--calib", default=None, help="npu (int8-static): calibration images, a folder "
              "or 'digits'.")
@click.option("--calib-samples", type=click.IntRange(1, 100_000), default=64, show_default=True)
@_quiet_option
def target(bundle: Path, target_name: str, buckets: str, batch: int, calib: str | None,
           calib_samples: int, quiet: bool) -> None:
    """Add an edge target to BUNDLE: per bucket a fixed-shape graph per precision.

    Each graph is checked against PyTorch (the bundle's weights) at exactly its size; one
    that fails is not written and the exit code is 1. The runtime picks a bucket per image
    (nearest aspect ratio, then area) and keeps the dynamic graph for other sizes.
    """
    from vit_deploy.progress import steps
    from vit_deploy.targets import TargetOptions, add_target, parse_buckets

    try:
        sizes = parse_buckets(buckets)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--buckets") from None
    options = TargetOptions(target=target_name, buckets=sizes, batch=batch, calibration=calib,
                            calibration_samples=calib_samples)
    with steps(quiet=quiet, title="target") as progress:
        report = add_target(bundle, options, progress=progress)
    _console().print(report)
    if not report:
        sys.exit(1)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--no-verify", is_flag=True, help="Skip the sha256 check of the files.")
def info(bundle: Path, as_json: bool, no_verify: bool) -> None:
    """Describe a bundle: model, inputs, files, parity, tool versions."""
    from vit_deploy.info import BundleSummary
    from vit_deploy.runtime.manifest import load_manifest

    manifest = load_manifest(bundle, verify=not no_verify)
    if as_json:
        click.echo(manifest.to_json(), nl=False)
        return
    _console().print(BundleSummary(manifest, str(bundle)))


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--provider", default="cpu", show_default=True,
              help="Provider alias or list in preference order (cpu, cuda, tensorrt, ...).")
@click.option("--fallback", is_flag=True, help="Allow falling back to the next provider.")
@click.option("--precision", default="fp32", show_default=True)
@click.option("--top-k", type=click.IntRange(1, 1_000_000), default=5, show_default=True)
@click.option("--resize", type=click.Choice(["shorter_side_center_crop", "patch_multiple"]),
              default=None, help="Override the manifest's resize rule.")
@click.option("--res", "resolution", type=RESOLUTION, default=None,
              help="Override the manifest's resolution (dynamic bundles take any multiple "
                   "of the patch size). Needed for a bare .onnx file.")
@click.option("--mean", default=None, help="Per-channel mean, e.g. 0.485,0.456,0.406 (a bare "
              ".onnx file has no manifest to say it).")
@click.option("--std", default=None, help="Per-channel std, e.g. 0.229,0.224,0.225.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None)
@click.option("--target", "predict_target", type=click.Choice(["auto", "none", *TARGET_NAMES]),
              default="auto", show_default=True, help="Bucket graphs to use: auto (the "
              "provider's target, if the bundle has it), none (the dynamic graph), or a name.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--features", "features_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write each image's dense outputs (patch_tokens, layer_N; "
              "[width, grid_h, grid_w], aspect ratio kept) to this .npz file.")
@click.option("--force", is_flag=True, help="Replace an existing --features file.")
def predict(bundle: Path, images: tuple[Path, ...], provider: str, fallback: bool,
            precision: str, top_k: int, resize: str | None, resolution: tuple[int, int] | None,
            mean: str | None, std: str | None, threads: int | None, as_json: bool,
            features_file: Path | None, force: bool, predict_target: str = "auto") -> None:
    """Classify IMAGES with a bundle, or a .onnx file exported by vit-deploy (no torch);
    with --features, write their patch-token feature maps."""
    from vit_deploy.runtime.contract import LOGITS_NAME
    from vit_deploy.runtime import RuntimeOptions, ViTSession
    from vit_deploy.runtime.manifest import dumps_strict
    from vit_deploy.runtime.providers import short_name

    _refuse_clobber({"--features": features_file}, bundles=[bundle], inputs=images)
    if features_file is not None and features_file.exists() and not force:
        raise click.BadParameter(f"{features_file} exists; pass --force to replace it",
                                 param_hint="--features")

    with warnings.catch_warnings():  # a fallback is reported below, in plain words
        warnings.simplefilter("ignore", RuntimeWarning)
        session = ViTSession(bundle, provider=provider, precision=precision,
                             fallback=fallback, options=RuntimeOptions(threads=threads),
                             target=predict_target)
    with session:
        classifier = LOGITS_NAME in session.output_names
        if not classifier and features_file is None:
            raise click.UsageError(f"{bundle} has no classifier (outputs: {session.output_names}); "
                                   f"write its features with --features out.npz")
        pre = session.preprocess(resize=resize, resolution=resolution, mean=_floats(mean),
                                 std=_floats(std))
        if session.buckets is not None and resize is None and resolution is None \
                and mean is None and std is None:
            pre = None  # bucket graphs: each image goes to its bucket (runtime/buckets.py)
        predictions = (session.predict(list(images), top_k=top_k, preprocess=pre)
                       if classifier else [])
        written = None
        if features_file is not None:
            dense = session.preprocess(resize=resize or "patch_multiple", resolution=resolution,
                                       mean=_floats(mean), std=_floats(std))
            written = _write_features(session, list(images), dense, features_file)
        ran_on = [short_name(p) for p in session.providers]
    if as_json:
        click.echo(dumps_strict({"providers": ran_on, "precision": precision,
                                 "predictions": [p.to_dict() for p in predictions],
                                 "features": written}))
        return
    console = _console()
    console.print(f"ran on {ran_on[0]} ({precision})" + (f"; {session.fallback_reason}"
                                                        if session.fallback_reason else ""))
    for p in predictions:
        console.print(p)
    if written:
        console.print(f"wrote {features_file}: " + ", ".join(
            f"{k} {tuple(v)}" for k, v in written["shapes"].items()))


def _write_features(session: Any, images: list[Path], pre: Any, path: Path) -> dict[str, Any]:
    """Each image's dense outputs as `<output>_<index>` arrays (width, grid_h, grid_w) in
    one .npz, written atomically, with the image names as `sources`."""
    import io

    import numpy as np

    from vit_deploy.runtime.files import write_bytes_atomic
    from vit_deploy.outputs import is_grid_output
    from vit_deploy.runtime.session import require_finite

    names = [n for n in session.output_names if is_grid_output(n)]
    if not names:
        raise click.UsageError(f"the bundle has no dense outputs (outputs: {session.output_names}); "
                               f"export with --outputs patch_tokens or --layers")
    arrays: dict[str, np.ndarray] = {"sources": np.array([str(i) for i in images])}
    for i, image in enumerate(images):
        outs = {n: require_finite(v, n) for n, v in session.run_all(pre(image)[None]).items()}
        arrays.update({f"{n}_{i}": outs[n][0] for n in names})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomic(path, buffer.getvalue())
    return {"file": str(path), "shapes": {k: list(v.shape) for k, v in arrays.items()
                                          if k != "sources"}}


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--patch", "patches", default=None, metavar="P1,P2,...",
              help="Patch sizes to deploy at (the kernel PI-resized). Default: the checkpoint's.")
@click.option("--merge-tokens", "merges", default="0", show_default=True, metavar="SPECS",
              help="Token-merging settings: numbers per block, comma-separated (0,4,8), or "
                   "';'-separated schedules (0;4,4,2,2).")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True)
@click.option("--res", "resolution", type=RESOLUTION, default=None,
              help="Resolution of every configuration. Default: the checkpoint's native one.")
@click.option("--eval-set", type=click.Choice(["digits", "none"]), default="none",
              show_default=True, help="digits: held-out accuracy of the shipped trained test "
              "models; none: cosine to the unmerged model at the checkpoint's patch size.")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Timing rounds, interleaved over the configurations.")
@click.option("--runs", type=click.IntRange(1, 100_000), default=20, show_default=True,
              help="Timed runs per configuration and round.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None)
@click.option("--budget-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Name the best-scoring configuration whose p90 stays under this.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None)
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="PNG: score against p90 latency, with the Pareto front.")
@_quiet_option
def sweep(checkpoint: Path, patches: str | None, merges: str, precisions: tuple[str, ...],
          resolution: tuple[int, int] | None, eval_set: str, rounds: int, runs: int,
          threads: int | None, budget_ms: float | None, json_out: Path | None,
          plot_out: Path | None, quiet: bool) -> None:
    """Export CHECKPOINT at every patch size × token merging × precision, score and time
    each (one fresh process per timing), and print the table and its Pareto front."""
    from vit_deploy.runtime.files import write_bytes_atomic
    from vit_deploy.progress import steps
    from vit_deploy.sweep import SweepOptions, parse_list, run_sweep

    _refuse_clobber({"--json": json_out, "--plot": plot_out}, bundles=[checkpoint])
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
    _console().print(report)
    if json_out:
        write_bytes_atomic(json_out, report.to_json().encode())
    if plot_out:
        try:
            report.plot(plot_out)
        except ImportError:
            raise click.UsageError("--plot needs matplotlib: pip install 'vit-deploy[plot]'") \
                from None


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def providers(as_json: bool) -> None:
    """What this onnxruntime lists, and whether a session really runs on each here."""
    from vit_deploy.runtime.providers import probe_all

    report = probe_all()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    _console().print(report)


def _read_labels(path: Path) -> tuple[str, ...]:
    try:
        return tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                     if line.strip())
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {str(path)!r}: {e}", param_hint="--labels") from None


if __name__ == "__main__":
    main()
