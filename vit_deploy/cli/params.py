"""Parameter types the commands share: inputs named on the command line (checked before a
command runs), resolutions, precision lists, counts and bounds. Torch-free."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from vit_deploy.runtime.contract import PRECISIONS
from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError
from vit_deploy.runtime.sizes import parse_resolution

MAX_BATCH = 4096


MAX_SEED = 2**32 - 1


MAX_PATCH = 1024  # pixels per patch side


class MissingInputError(VitDeployError, FileNotFoundError):
    """A path the command reads (BUNDLE, CHECKPOINT, a saved report) that does not exist or
    cannot be read: refused with one line, exit 2, before any work."""

    exit_code = BAD_INPUT


class OutputNameError(VitDeployError, ValueError):
    """An output path that names something else (an image given as --json FILE)."""

    exit_code = BAD_INPUT


class InputPath(click.ParamType):
    """A path the command reads, checked as it is parsed: it exists (after recovering a
    bundle a killed writer moved aside) and can be read; else MissingInputError naming it."""

    name = "path"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        path = Path(value)
        if ctx is not None and ctx.resilient_parsing:  # shell completion: no checks
            return path
        problem = unreadable(path)
        if problem:
            raise MissingInputError(f"{self.what} {str(value)!r} {problem}")
        return path


def unreadable(path: Path) -> str | None:
    """Why `path` cannot be read ("does not exist", ...), or None."""
    if not os.path.exists(path):
        from vit_deploy.runtime.swap import recover_on_open

        try:  # a writer killed mid-swap may have moved the bundle aside: put it back
            recover_on_open(path)
        except (OSError, RuntimeError, ValueError):
            pass
        if not os.path.exists(path):
            return ("is a broken link (to a path that does not exist)"
                    if os.path.islink(path) else "does not exist")
    if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
        return "cannot be read (permission denied)"
    return None


class ResolutionType(click.ParamType):
    name = "N|HxW"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self.name  # as written: click would upper-case it

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, tuple):
            return value
        try:
            return parse_resolution(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


RESOLUTION = ResolutionType()


class PrecisionList(click.ParamType):
    name = ",".join(PRECISIONS) + "|all"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self.name  # the names as they are typed

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
