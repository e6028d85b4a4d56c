"""`vit-deploy bench --compare`: saved reports side by side, from any runtime (Python bench
and check reports, Node's `vit.check()`, the page's download: reports/schema.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_deploy.bench.report import BenchReport
from vit_deploy.reports.files import parse_report, read_report
from vit_deploy.reports.schema import Cell, Column, ReportError, check_column, is_schema
from vit_deploy.runtime.sizes import format_resolution


REPORT_KINDS = ("a vit-deploy report (bench --json, check --json, Node's vit.check(), the "
                "page's download)")


@dataclass
class Comparison:
    """Saved reports side by side, from one machine or several: one row per case (provider
    asked, precision, size, batch, threads), one column per report headed by the runtime
    and the machine it ran on; each cell is p50 / p90 in ms and the provider that really
    ran, and parity where the report checked it (pass / FAIL, worst cosine)."""

    columns: list[Column]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def rows(self) -> list[list[str]]:
        keys: dict[tuple, None] = {}
        for column in self.columns:
            keys.update(dict.fromkeys(column.cells))
        return [[asked, precision, format_resolution(res), str(batch),
                 str(threads or "default"), *(_cell(c.cells.get(k)) for c in self.columns)]
                for k in keys for asked, precision, res, batch, threads in [k]]

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.markup import escape
        from rich.table import Table

        # Each report's column is headed [n] and its name: reports of one runtime often differ
        # only at the end of the name (page-wasm-fp32, page-webgpu-fp32), which a narrow
        # column cuts off; [n] still says which line above the table the column is.
        table = Table("asked", "precision", "res", "batch", "threads",
                      caption="each cell: p50 / p90 ms (the provider that ran), parity: pass or "
                              "FAIL failed/cases, worst cosine", caption_justify="left")
        for i, c in enumerate(self.columns, 1):
            table.add_column(escape(f"[{i}] {Path(c.name).stem}\n{c.runtime}\n{c.device}"),
                             overflow="fold")
        for row in self.rows():  # a report's text is shown as it is, never as markup
            table.add_row(*(escape(cell) for cell in row))
        machines = [escape(f"[{i}] {Path(c.name).stem}: {c.machine}") + (
            "" if c.passed is None else f"; check {'PASS' if c.passed else 'FAIL'}")
            for i, c in enumerate(self.columns, 1)]
        return Group(*machines, table)


def _cell(c: Cell | None) -> str:
    if c is None:
        return "-"
    parts = []
    if c.p50_ms is not None:
        p90 = f"{c.p90_ms:.2f}" if c.p90_ms is not None else "-"
        parts.append(f"{c.p50_ms:.2f} / {p90} ({c.ran})")
    elif c.status:
        parts.append(c.status[:30])
    if c.parity_cases:
        cos = "-" if c.worst_cosine is None else f"{c.worst_cosine:.6f}"
        verdict = "pass" if not c.parity_failed else f"FAIL {c.parity_failed}/{c.parity_cases}"
        parts.append(f"{verdict} cos {cos}" + ("" if parts else f" ({c.ran})"))
    return ", ".join(parts) or "-"


def bench_column(name: str, report: BenchReport) -> Column:
    env = report.environment
    runtime = f"onnxruntime {env.get('onnxruntime') or '?'} (python)"
    column = Column(name, runtime,
                    str(env.get("gpu") or "").split(",")[0] or str(env.get("cpu") or "unknown machine"),
                    f"{env.get('cpu') or 'unknown CPU'} ({env.get('cores') or '?'} cores); GPU "
                    f"{env.get('gpu') or 'none'}; onnxruntime {env.get('onnxruntime') or '?'}")
    for c in report.cases:
        precision = c.configuration + ("" if c.graph == "dynamic" else f" [{c.graph}]")
        s = c.stats()
        column.cells[(c.requested, precision, c.resolution, c.batch, c.threads)] = Cell(
            ran=c.provider, p50_ms=s.get("p50_ms"), p90_ms=s.get("p90_ms"), status=c.status)
    return column


def load_column(path: str | Path) -> Column:
    """A saved report of any runtime as a column (ReportError if it is not one). Read and
    parsed as BenchReport.load does: a regular file only, JSON a report can hold."""
    source = repr(str(path))
    data = parse_report(read_report(path), source=source, what=REPORT_KINDS)
    if is_schema(data) and data.get("kind") == "check":
        return check_column(str(path), data, source)
    return bench_column(str(path), BenchReport.from_dict(data, source=source))


def compare_reports(paths: Sequence[str | Path]) -> Comparison:
    """`vit-deploy bench --compare a.json b.json c.json`: reports from other runs, machines
    or runtimes (ReportError if one is not a report)."""
    if not paths:
        raise ReportError("--compare needs one or more saved reports (bench --json, check "
                          "--json, Node's vit.check(), the page's download)")
    return Comparison([load_column(p) for p in paths])
