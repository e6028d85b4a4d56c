"""Saving a report in the formats a command was asked for (--json, --csv, --markdown,
--plot): one place for what `check`, `bench` and `sweep` all end with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError
from vit_deploy.runtime.files import write_bytes_atomic


class MissingExtraError(VitDeployError, ImportError):
    """An optional dependency (an install extra) that this request needs is missing."""

    exit_code = BAD_INPUT


def save_report(report: Any, *, json: Path | None = None, csv: Path | None = None,
                markdown: Path | None = None, plot: Path | None = None) -> list[Path]:
    """Write `report` to each path given: its to_json(), to_csv(), to_markdown(), and its
    plot(path) (matplotlib, the `plot` extra). Each file is written atomically, in that
    order; returns the paths written."""
    written = []
    for path, render in ((json, "to_json"), (csv, "to_csv"), (markdown, "to_markdown")):
        if path is not None:
            written.append(write_bytes_atomic(Path(path), getattr(report, render)().encode()))
    if plot is not None:
        try:
            import matplotlib  # noqa: F401  (the plot methods import pyplot themselves)
        except ImportError:
            raise MissingExtraError("--plot needs matplotlib: pip install "
                                    "'vit-deploy[plot]'") from None
        written.append(Path(report.plot(plot)))
    return written


__all__ = ["MissingExtraError", "save_report"]
