"""`vit-deploy bench --compare`: saved bench reports side by side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_deploy.bench_report import BenchReport, CaseResult, ReportError
from vit_deploy.runtime.sizes import format_resolution


@dataclass
class Comparison:
    """Saved bench reports side by side, from one machine or several: one row per case
    (asked provider, precision, size, batch, threads), one column per report headed by the
    machine it ran on; each cell is p50 / p90 in ms and the provider that really ran."""

    names: list[str]
    reports: list[BenchReport]

    def rows(self) -> list[list[str]]:
        keys: dict[tuple, dict[int, CaseResult]] = {}
        for i, report in enumerate(self.reports):
            for c in report.cases:
                precision = c.precision + ("" if c.graph == "dynamic" else f" [{c.graph}]")
                key = (c.requested, precision, c.resolution, c.batch, c.threads)
                keys.setdefault(key, {})[i] = c
        return [[requested, precision, format_resolution(res), str(batch),
                 str(threads or "default"), *(_cell(by.get(i)) for i in range(len(self.reports)))]
                for (requested, precision, res, batch, threads), by in keys.items()]

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        table = Table("asked", "precision", "res", "batch", "threads",
                      *[f"{Path(n).stem}: p50 / p90 ms (ran on)\n{_device(r.environment)}"
                        for n, r in zip(self.names, self.reports)])
        for row in self.rows():
            table.add_row(*row)
        machines = [f"{Path(n).stem}: {_machine(r.environment)}"
                    for n, r in zip(self.names, self.reports)]
        return Group(*machines, table)


def _cell(c: CaseResult | None) -> str:
    if c is None:
        return "-"
    s = c.stats()
    if s.get("p50_ms") is None:
        return c.status[:30]
    p90 = f"{s['p90_ms']:.2f}" if s.get("p90_ms") is not None else "-"
    return f"{s['p50_ms']:.2f} / {p90} ({c.provider})"


def _device(env: dict[str, Any]) -> str:
    """The column's machine: its GPU's name where it has one (nvidia-smi: name, driver,
    memory), else its CPU."""
    return str(env.get("gpu") or "").split(",")[0] or str(env.get("cpu") or "unknown machine")


def _machine(env: dict[str, Any]) -> str:
    return (f"{env.get('cpu') or 'unknown CPU'} ({env.get('cores') or '?'} cores); GPU "
            f"{env.get('gpu') or 'none'}; onnxruntime {env.get('onnxruntime') or '?'}")


def compare_reports(paths: Sequence[str | Path]) -> Comparison:
    """`vit-deploy bench --compare a.json b.json c.json`: reports from other runs or
    machines, each read by BenchReport.load (ReportError if one is not a report)."""
    if not paths:
        raise ReportError("--compare needs one or more saved reports (bench --json)")
    return Comparison([str(p) for p in paths], [BenchReport.load(p) for p in paths])
