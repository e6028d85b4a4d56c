"""The options several commands share, defined once: option groups (--provider,
--precision, --json [FILE], --quiet, --force, --res, --batch), the console and the clobber
guard (parameter types: cli/params.py; the vocabulary: cli/vocabulary.py). Torch-free."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from vit_deploy.cli.params import MAX_BATCH, OutputNameError, count, csv_list
from vit_deploy.runtime.contract import MAX_THREADS, PRECISIONS
from vit_deploy.runtime.sizes import parse_resolution


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


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
                      "into the graph; auto: part of the recipe search (none first, then 0.5 "
                      "and 0.75 if the target is not met, each fitted on half the "
                      "calibration images and scored on the other half; the best kept)."),
    click.option("--calib-method", type=click.Choice(["minmax", "entropy", "percentile"]),
                 default="minmax", show_default=True,
                 help="int8-static: how activation ranges are taken from the calibration "
                      "images (minmax, entropy or percentile)."),
    click.option("--calib-samples", type=click.IntRange(1, 100_000), default=64,
                 show_default=True, help="Calibration images used at most (1 to 100000)."),
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

PRECISION = click.Choice(PRECISIONS)  # one precision (predict, serve, triton)


def provider_option(*, measured: bool) -> Decorator:
    """--provider: in check and bench each provider listed is measured (--providers, the old
    spelling, still works there); in predict and serve the list is an order of preference."""
    if measured:
        return click.option("--provider", "--providers", "providers", default="cpu",
                            show_default=True, metavar="P1,P2,...",
                            help="Providers to measure, comma-separated (cpu, cuda, tensorrt, "
                                 "openvino, ...; `vit-deploy providers` lists them): each one "
                                 "listed is measured. --providers is the old spelling, still "
                                 "accepted.")
    return click.option("--provider", default="cpu", show_default=True, metavar="P1,P2,...",
                        help="Provider, or a comma-separated list in order of preference "
                             "(cpu, cuda, tensorrt, openvino, ...): the first one active here "
                             "runs, and the output says which.")


def precision_option(help: str, **kw: Any) -> Decorator:
    """--precision, one of the known precisions (a name the runtime does not know is refused
    here, listing them, before a bundle is opened)."""
    return click.option("--precision", type=PRECISION, default="fp32", show_default=True,
                        help=help, **kw)


STDOUT = Path("-")  # --json given alone


def json_option(what: str) -> Decorator:
    """--json [FILE]: alone, JSON on stdout (and nothing else there); with FILE, written to
    it atomically. Put it last, or write --json=FILE, where arguments follow."""
    return click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True,
                                                             path_type=Path),
                        is_flag=False, flag_value="-", default=None, metavar="[FILE]",
                        help=f"{what} as JSON. --json alone: on stdout, and nothing else is "
                             f"printed there (pipe it to a JSON tool); --json FILE: written "
                             f"to FILE, the usual output kept.")


def json_to_stdout(json_out: Path | None) -> bool:
    return json_out is not None and str(json_out) == str(STDOUT)


def json_file(json_out: Path | None) -> Path | None:
    """The --json FILE to write, or None (not given, or stdout)."""
    return None if json_out is None or json_to_stdout(json_out) else json_out


def emit_json(json_out: Path | None, text: str) -> None:
    """--json's JSON: on stdout (--json alone) or written to FILE atomically."""
    if json_out is None:
        return
    if json_to_stdout(json_out):
        click.echo(text, nl=not text.endswith("\n"))
        return
    from vit_deploy.runtime.files import write_bytes_atomic

    write_bytes_atomic(Path(json_out), text.encode())


def show_result(result: Any, json_out: Path | None, quiet: bool) -> None:
    """A command's result as the user asked: --json (stdout alone, or FILE beside the
    rest), -q's plain lines (`result.lines()`), else the rich rendering."""
    emit_json(json_out, result.to_json())
    if json_to_stdout(json_out):
        return
    if quiet:
        for line in result.lines():
            click.echo(line)
        return
    console().print(result)


def quiet_option(result: str) -> Decorator:
    """--quiet / -q: no progress, tables or banners; `result` says what is still printed."""
    return click.option("--quiet", "-q", is_flag=True,
                        help=f"No progress, tables or banners (for scripts): {result}. "
                             f"Errors still go to stderr.")


threads_option = click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
                              help="Intra-op threads (default: ONNX Runtime's).")


def output_file(flag: str, dest: str, help: str) -> Decorator:
    """A file the command writes (--csv, --markdown, --plot), refused by refuse_clobber
    where it would land in what the command reads."""
    return click.option(flag, dest, type=click.Path(dir_okay=False, path_type=Path),
                        default=None, metavar="FILE", help=help)


def force_option(help: str) -> Decorator:
    return click.option("--force", is_flag=True, help=help)


FORCE_INTO_OUT = ("Write into --out even if vit-deploy did not write it (its files are "
                  "kept).")


def resolutions_option(help: str) -> Decorator:
    return click.option("--res", "resolutions", default=None, metavar="R1,R2,...",
                        callback=csv_list(parse_resolution), help=help)


def batches_option(default: str) -> Decorator:
    return click.option("--batch", "batches", default=default, show_default=True,
                        metavar="B1,B2,...", callback=csv_list(count("batch sizes", MAX_BATCH)),
                        help=f"Comma-separated batch sizes (1 to {MAX_BATCH}).")


def console(*, stderr: bool = False) -> Any:
    """Where tables and lines are printed: stdout (the result), or stderr (errors)."""
    from rich.console import Console

    out = Console(highlight=False, soft_wrap=True, stderr=stderr)
    if not out.is_terminal:  # pipes and CI logs: do not squeeze tables into 80 columns
        out = Console(highlight=False, soft_wrap=True, width=160, stderr=stderr)
    return out


def refuse_clobber(outputs: dict[str, Path | None], *, bundles: Any = (),
                   inputs: Any = ()) -> None:
    """Each output file the user named (option -> path) must not land in a bundle the
    command reads or on one of its inputs (`atomic.refuse_clobber`: exit 2 naming it).
    `--json` alone (stdout) writes no file. An existing file that is not .json is not a
    --json FILE: `predict B --json a.jpg b.jpg` would otherwise write over a.jpg."""
    from vit_deploy.atomic import refuse_clobber as refuse

    for option, path in outputs.items():
        if option == "--json":
            path = json_file(path)
        if path is not None:
            refuse(path, option=option, bundles=bundles, inputs=inputs)
            if option == "--json" and path.suffix.lower() != ".json" and path.exists():
                raise OutputNameError(
                    f"--json {str(path)!r} exists and is not a .json file; to print JSON "
                    f"on stdout put --json last (or write --json -)")
