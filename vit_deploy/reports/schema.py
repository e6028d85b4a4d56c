"""One report schema for every runtime: Python `check --json` / `bench --json`, Node's
`vit.check()`, the page's download (docs/proving.md). This module writes its envelope
and reads any runtime's report back for `bench --compare`.

    {"schema": "vit-deploy-report", "schema_version": 1, "kind": "check" | "bench",
     "bundle": str, "device": {"runtime", "platform", "cpu", "gpu"}, "reference": str,
     "passed": bool,
     "cases": [{"label", "provider", "precision", "resolution", "batch", "output",
                "max_abs", "abs_tol", "cosine", "cosine_min", "passed"}],
     "latency": [{"provider", "precision", "resolution", "batch", "p50_ms", "p90_ms", "runs"}]}

Python's own reports keep their older fields beside these; a Python *bench* report's
`cases` are its latency records (as before the schema), its schema rows are `latency`.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError

SCHEMA = "vit-deploy-report"
SCHEMA_VERSION = 1
KINDS = ("check", "bench")


class ReportError(VitDeployError, ValueError):
    """A saved report that cannot be read: says which file, which field and why."""

    exit_code = BAD_INPUT


def device(env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """This machine as the schema names it; from a bench environment where there is one."""
    if env is None:
        import onnxruntime

        from vit_deploy.reports.machine import cpu_name, gpu_name

        env = {"onnxruntime": onnxruntime.__version__, "cpu": cpu_name(), "gpu": gpu_name(),
               "system": platform.system(), "machine": platform.machine(),
               "python": platform.python_version()}
    return {"runtime": f"onnxruntime {env.get('onnxruntime')} (python)",
            "platform": f"{env.get('system')} {env.get('machine')}, python {env.get('python')}",
            "cpu": env.get("cpu"), "gpu": env.get("gpu")}


def envelope(kind: str, *, bundle: str, device: Mapping[str, Any], reference: str | None,
             passed: bool) -> dict[str, Any]:
    """The schema's fields a report starts with (its cases and latency follow)."""
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": kind, "bundle": bundle,
            "device": dict(device), "reference": reference, "passed": passed}


def is_schema(data: Any) -> bool:
    return isinstance(data, dict) and data.get("schema") == SCHEMA


# -- reading any runtime's report (bench --compare) ------------------------------------
@dataclass
class Cell:
    """What one report says about one row: latency and / or parity."""

    ran: str
    p50_ms: float | None = None
    p90_ms: float | None = None
    status: str = "ok"
    parity_cases: int = 0
    parity_failed: int = 0
    worst_cosine: float | None = None

    def add_parity(self, passed: bool, cosine: float | None) -> None:
        self.parity_cases += 1
        self.parity_failed += not passed
        if cosine is None:  # a non-finite cosine was written as null: the worst there is
            self.parity_failed += passed
        elif self.worst_cosine is None or cosine < self.worst_cosine:
            self.worst_cosine = cosine


@dataclass
class Column:
    """One report, as --compare shows it: where it ran and its cells by row key
    (provider asked, precision, (H, W), batch, threads)."""

    name: str
    runtime: str
    device: str  # the GPU where there is one, else the CPU
    machine: str  # the longer line printed above the table
    cells: dict[tuple, Cell] = field(default_factory=dict)
    kind: str = "bench"
    passed: bool | None = None


def check_column(name: str, data: Any, source: str) -> Column:
    """A schema report of kind "check" (from any runtime) as a column; ReportError names the
    file, the entry and the field that is wrong."""
    def need(ok: bool, where: str, what: str, got: Any) -> None:
        if not ok:
            raise ReportError(f"{source} is not a vit-deploy report: {where} must be {what}, "
                              f"got {str(got)[:60]!r}")

    def number(v: Any, null: bool = True) -> bool:
        return (v is None and null) or (isinstance(v, (int, float)) and not isinstance(v, bool))

    def size(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    need(data.get("schema_version") == SCHEMA_VERSION, "'schema_version'", str(SCHEMA_VERSION),
         data.get("schema_version"))
    need(data.get("kind") == "check", "'kind'", "'check' here", data.get("kind"))
    dev = data.get("device")
    need(isinstance(dev, dict) and isinstance(dev.get("runtime"), str), "'device'",
         "an object with a runtime", dev)
    for key in ("cases", "latency"):
        need(isinstance(data.get(key, []), list), repr(key), "a list", data.get(key))
    column = Column(name, dev["runtime"], str(dev.get("gpu") or dev.get("cpu") or "unknown"),
                    f"{dev.get('cpu') or 'unknown CPU'}; GPU {dev.get('gpu') or 'none'}; "
                    f"{dev['runtime']} on {dev.get('platform') or '?'}", kind="check",
                    passed=data.get("passed") if isinstance(data.get("passed"), bool) else None)

    def key(entry: dict, at: str) -> tuple:
        need(isinstance(entry, dict), at, "an object", entry)
        for k in ("provider", "precision"):
            need(isinstance(entry.get(k), str), f"{at} {k!r}", "a string", entry.get(k))
        res = entry.get("resolution")
        need(isinstance(res, list) and len(res) == 2 and all(size(v) for v in res),
             f"{at} 'resolution'", "[height, width]", res)
        need(size(entry.get("batch")), f"{at} 'batch'", "a positive integer", entry.get("batch"))
        return entry["provider"], entry["precision"], (res[0], res[1]), entry["batch"], None

    for i, c in enumerate(data.get("cases", [])):
        at = f"case {i + 1}"
        k = key(c, at)
        need(isinstance(c.get("passed"), bool), f"{at} 'passed'", "true or false", c.get("passed"))
        need(number(c.get("cosine")), f"{at} 'cosine'", "a number or null", c.get("cosine"))
        column.cells.setdefault(k, Cell(ran=c["provider"], status="")).add_parity(
            c["passed"], c.get("cosine"))
    for i, t in enumerate(data.get("latency", [])):
        at = f"latency {i + 1}"
        k = key(t, at)
        for s in ("p50_ms", "p90_ms"):
            need(number(t.get(s)), f"{at} {s!r}", "a number or null", t.get(s))
        cell = column.cells.setdefault(k, Cell(ran=t["provider"]))
        cell.p50_ms, cell.p90_ms, cell.status = t.get("p50_ms"), t.get("p90_ms"), "ok"
    return column
