"""What `vit-deploy target` returns: each graph's parity against PyTorch and the target's
record (ORT format, ORT's mobile checker), as a report that renders itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vit_deploy.info import mobile_lines
from vit_deploy.parity import ParityReport
from vit_deploy.runtime.sizes import format_resolution


@dataclass
class GraphResult:
    resolution: tuple[int, int]
    precision: str
    file: str
    parity: ParityReport
    nodes: int
    ort_file: str | None = None
    ort_parity: ParityReport | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.parity) and (self.ort_parity is None or bool(self.ort_parity))

    def to_dict(self) -> dict[str, Any]:
        worst = lambda r: {"max_abs": max(c.max_abs for c in r.cases),  # noqa: E731
                           "cosine": min(c.cosine for c in r.cases), "passed": bool(r)}
        return {"resolution": list(self.resolution), "precision": self.precision,
                "file": self.file, "nodes": self.nodes, "passed": self.passed,
                "parity": worst(self.parity) | {"cases": self.parity.to_dict()["cases"],
                                                 "checks": self.parity.to_dict()["checks"]},
                "ort_file": self.ort_file,
                "ort_parity": worst(self.ort_parity) if self.ort_parity else None,
                "notes": list(self.notes)}


@dataclass
class TargetReport:
    bundle: str
    target: str
    batch: int
    results: list[GraphResult]
    record: dict[str, Any]

    @property
    def failed(self) -> list[GraphResult]:
        return [r for r in self.results if not r.passed]

    def __bool__(self) -> bool:
        return not self.failed

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        table = Table("bucket", "precision", "nodes", "max|Δ| vs torch", "cosine", ".ort max|Δ|",
                      "result", title=f"target {self.target} (batch {self.batch}) vs PyTorch",
                      title_justify="left")
        for r in self.results:
            table.add_row(format_resolution(r.resolution), r.precision, str(r.nodes),
                          f"{max(c.max_abs for c in r.parity.cases):.2e}",
                          f"{min(c.cosine for c in r.parity.cases):.7f}",
                          f"{max(c.max_abs for c in r.ort_parity.cases):.2e}" if r.ort_parity
                          else "-", "ok" if r.passed else "[red]FAIL, not written[/]")
        lines: list[Any] = [table]
        lines += mobile_lines(self.record.get("mobile_check"))
        fmt = self.record.get("ort_format")
        if fmt:
            lines.append(f"ORT format: {fmt['files']} file(s), opset {fmt['opset']}, IR "
                         f"{fmt['ir_version']}, converted by onnxruntime {fmt['onnxruntime']} "
                         f"(level {fmt['optimization_level']}); {fmt['loads_in']}")
        for r in self.results:
            lines += [f"{format_resolution(r.resolution)} {r.precision}: {n}" for n in r.notes]
        if self.failed:
            lines.append(f"[red]{len(self.failed)} graph(s) failed the tolerance policy and were "
                         f"not written[/]")
        return Group(*lines)
