"""What several commands share, defined once: parameter types (resolutions, precision
lists, counts), option groups (quantisation, --json / --plot files, --force, --quiet),
the console and the clobber guard. Torch-free: every command module imports this."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from vit_deploy.runtime.contract import MAX_THREADS, PRECISIONS
from vit_deploy.runtime.sizes import parse_resolution

MAX_BATCH = 4096
MAX_SEED = 2**32 - 1
MAX_PATCH = 1024  # pixels per patch side

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


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


def csv_list(convert: Callable[[str], Any]) -> Callable[..., Any]:
    """A click callback: 'a,b,c' -> (convert(a), convert(b), convert(c)); a ValueError
    becomes click.BadParameter (exit 2, naming the option)."""
    def callback(ctx: click.Context, param: click.Parameter, value: str | None):
        if value is None:
            return None
        try:
            return tuple(convert(v.strip()) for v in value.split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return callback


def count(what: str, high: int, default: str | None = None) -> Callable[[str], int | None]:
    """A converter of '1'..str(high) (and `default` -> None) for csv_list."""
    def convert(v: str) -> int | None:
        if default is not None and v == default:
            return None
        if not v.isdigit() or not 1 <= int(v) <= high:
            raise ValueError(f"{what} must be positive integers up to {high}"
                             + (f" or '{default}'" if default else "") + f", got {v[:20]!r}")
        return int(v)
    return convert


def floats(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}") from None


def providers_list(text: str) -> tuple[str, ...]:
    return tuple(p for p in text.split(",") if p.strip())


def group(*options: Decorator) -> Decorator:
    """Several click options as one decorator, listed in the order they are written."""
    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = option(func)
        return func
    return apply


quant_options = group(  # `quantize` and `export --precision`
    click.option("--calib", default=None, metavar="DIR|photos|digits",
                 help="int8 calibration images (activation ranges, smoothing statistics): "
                      "a folder of images; 'photos' (default): the real photographs shipped "
                      "with vit-deploy; 'digits': the trained test model's training split."),
    click.option("--eval", "eval_images", default=None, metavar="DIR|photos",
                 help="Real images that judge every precision (the verdict, --max-drop). "
                      "Default: every 4th image of --calib DIR, held out from calibration; "
                      "else the held-out photographs shipped with vit-deploy."),
    click.option("--smooth", default="auto", show_default=True, metavar="auto|none|ALPHA",
                 help="int8: SmoothQuant scale migration (LayerNorm -> qkv / fc1) folded "
                      "into the graph; auto tries none, 0.5 and 0.75 on the calibration "
                      "images and keeps the best."),
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
                      "1 - the worst image's cosine on the --eval images)."),
    click.option("--eval-set", type=click.Choice(["digits"]), default=None,
                 help="Also measure top-1 accuracy on a labelled held-out set shipped "
                      "with the package (digits: the trained test model's)."),
)

quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress lines (for scripts).")
json_flag = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
threads_option = click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None)


def output_file(flag: str, dest: str, help: str | None = None) -> Decorator:
    """A file the command writes (--json, --csv, --markdown, --plot), refused by
    refuse_clobber where it would land in what the command reads."""
    return click.option(flag, dest, type=click.Path(dir_okay=False, path_type=Path),
                        default=None, help=help)


def force_option(help: str) -> Decorator:
    return click.option("--force", is_flag=True, help=help)


FORCE_INTO_OUT = ("Write into --out even if vit-deploy did not write it (its files are "
                  "kept).")


def resolutions_option(help: str) -> Decorator:
    return click.option("--res", "resolutions", default=None, callback=csv_list(parse_resolution),
                        help=help)


def batches_option(default: str) -> Decorator:
    return click.option("--batch", "batches", default=default, show_default=True,
                        callback=csv_list(count("batch sizes", MAX_BATCH)))


def console() -> Any:
    from rich.console import Console

    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal:  # pipes and CI logs: do not squeeze tables into 80 columns
        out = Console(highlight=False, soft_wrap=True, width=160)
    return out


def refuse_clobber(outputs: dict[str, Path | None], *, bundles: Any = (),
                   inputs: Any = ()) -> None:
    """Each output file the user named (option -> path) must not land in a bundle the
    command reads or on one of its inputs (`atomic.refuse_clobber`: exit 2 naming it)."""
    from vit_deploy.atomic import refuse_clobber as refuse

    for option, path in outputs.items():
        if path is not None:
            refuse(path, option=option, bundles=bundles, inputs=inputs)
