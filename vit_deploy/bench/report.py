"""A bench run's results as a value: cases, statistics, the table, the latency budget, the
plot, CSV, and saved reports read back (`BenchReport.from_json`, every field checked)."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.reports.files import parse_report, read_report
from vit_deploy.reports.schema import ReportError, device, envelope
from vit_deploy.runtime.manifest import dumps_strict
from vit_deploy.runtime.sizes import format_resolution

STATS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "runs", "images_per_s")


@dataclass
class CaseResult:
    provider: str  # what actually ran ('torch' for the PyTorch eager baseline)
    requested: str
    precision: str
    resolution: tuple[int, int]
    batch: int
    threads: int | None
    latencies_ms: list[float] = field(repr=False, default_factory=list)
    session_medians_ms: list[float] = field(default_factory=list)
    cold_start_ms: float = 0.0  # session creation + first run
    memory_mb: float = 0.0  # RSS growth from session creation and first run
    gpu_memory_mb: float | None = None
    status: str = "ok"  # ok | unavailable: <why>
    ratio_to_torch: float | None = None
    graph: str = "dynamic"  # or "bucket:<target>": the target's static graph at this size
    # bench --floor: the least time this machine's measured GEMM peaks allow (bench/floor.py)
    floor_ms: float | None = None
    # The statistics of a report read back (BenchReport.from_json): latencies are not saved.
    saved_stats: dict[str, float] = field(repr=False, default_factory=dict)
    # what is not int8 ran in (RuntimeOptions.float_precision: bf16 on OpenVINO's engine)
    float_precision: str = "f32"
    # another float precision, judged on real photographs (bench/run.py: _judge_on_photos):
    # {on, output, cosine_min, floor, passed}; recommended only where it passed
    judged: dict[str, Any] | None = None

    @property
    def configuration(self) -> str:
        """The precision as it ran: the file's, and the float precision where not f32."""
        return self.precision + ("" if self.float_precision == "f32"
                                 else f" +{self.float_precision}")

    def stats(self) -> dict[str, float]:
        a = np.asarray(self.latencies_ms)
        if not a.size:
            return dict(self.saved_stats)
        p50 = float(np.percentile(a, 50))
        return {"p50_ms": p50, "p90_ms": float(np.percentile(a, 90)),
                "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean()),
                "min_ms": float(a.min()), "max_ms": float(a.max()), "runs": int(a.size),
                "images_per_s": 1000.0 * self.batch / p50 if p50 > 0 else 0.0}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("latencies_ms")
        d.pop("saved_stats")
        d["resolution"] = list(self.resolution)
        return d | self.stats() | {"of_floor": self.of_floor()}

    def of_floor(self) -> float | None:
        """floor / p50: 1.0 would be every matrix product at the machine's peak."""
        p50 = self.stats().get("p50_ms")
        return self.floor_ms / p50 if self.floor_ms and p50 else None


@dataclass
class BenchReport:
    bundle: str
    environment: dict[str, Any]
    options: dict[str, Any]
    cases: list[CaseResult]
    # --budget-ms: the largest resolution within it per provider and precision is said
    # below the table and saved as "budget" (within_budget)
    budget_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The shared report schema (reports/schema.py, kind "bench": its rows under
        `latency`) with this report's own fields: `cases` are the full bench records."""
        d = envelope("bench", bundle=self.bundle, device=device(self.environment),
                     reference="none (latency only)",
                     passed=all(c.status.startswith("ok") for c in self.cases))
        d |= {"environment": self.environment, "options": self.options,
              "cases": [c.to_dict() for c in self.cases], "latency": self.latency()}
        if self.budget_ms is not None:
            d["budget"] = within_budget(self, self.budget_ms)
            d["recommended"] = recommend(self, self.budget_ms)
        return d

    def to_json(self) -> str:
        return dumps_strict(self.to_dict())

    def latency(self) -> list[dict[str, Any]]:
        """The schema's latency rows: one per measured case (provider = what ran)."""
        rows = []
        for c in self.cases:
            s = c.stats()
            if s.get("p50_ms") is None:
                continue
            rows.append({"provider": c.provider, "precision": c.precision,
                         "float_precision": c.float_precision,
                         "resolution": list(c.resolution), "batch": c.batch,
                         "p50_ms": s["p50_ms"], "p90_ms": s.get("p90_ms"),
                         "runs": int(s.get("runs") or 0), "threads": c.threads,
                         "graph": c.graph})
        return rows

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "report") -> BenchReport:
        """A report saved with `bench --json`, every field checked (ReportError names the
        file, the case and the field). Latencies are not saved: `stats()` gives the saved
        percentiles."""
        return cls.from_dict(parse_report(text, source=source), source=source)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "report") -> BenchReport:
        """A report already parsed (parse_report), every field checked as from_json does."""
        return _report_from_dict(data, source)

    @classmethod
    def load(cls, path: str | Path) -> BenchReport:
        return cls.from_json(read_report(path), source=repr(str(path)))

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        env = self.environment
        spinning = {None: "default", True: "on", False: "off"}[self.options.get("ort_spinning")]
        table = Table(*TABLE_HEADER)
        for row in format_table(self):
            table.add_row(*row)
        return Group(
            f"{env.get('cpu')} ({env.get('cores')} cores; {', '.join(env.get('cpu_flags', []))})"
            f"; GPU: {env.get('gpu') or 'none'}; onnxruntime {env.get('onnxruntime')}, torch "
            f"{env.get('torch')}; {self.options.get('sessions')} session(s) per case, "
            f"interleaved; ORT spinning {spinning}{_probe_text(env)}{_peaks_text(env)}", table,
            *status_notes(self),
            *(budget_lines(self, self.budget_ms) if self.budget_ms is not None else ()))

    def plot(self, path: str | Path) -> Path:
        return plot(self, path)

    def to_csv(self) -> str:
        rows = [c.to_dict() for c in self.cases]
        keys = ["provider", "requested", "precision", "resolution", "batch", "threads", "p50_ms",
                "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "runs", "images_per_s",
                "ratio_to_torch", "floor_ms", "of_floor", "cold_start_ms", "memory_mb",
                "gpu_memory_mb", "status"]
        buf = io.StringIO()
        w = csv.DictWriter(buf, keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            r["resolution"] = f"{r['resolution'][0]}x{r['resolution'][1]}"
            w.writerow(r)
        return buf.getvalue()


def format_table(report: BenchReport) -> list[list[str]]:
    rows = []
    for c in report.cases:
        s = c.stats()
        res = f"{c.resolution[0]}x{c.resolution[1]}"
        status = c.status.split(":")[0] + (" (see below)" if ":" in c.status else "")
        if not s:
            rows.append([c.requested, c.provider, _precision_label(c), res, str(c.batch),
                         str(c.threads or "default"), "-", "-", "-", "-", "-", "-", "-", "-",
                         "-", status])
            continue
        spread = (f"{min(c.session_medians_ms):.1f}-{max(c.session_medians_ms):.1f}"
                  if c.session_medians_ms else "-")
        rows.append([c.requested, c.provider, _precision_label(c), res, str(c.batch),
                     str(c.threads or "default"), f"{s['p50_ms']:.2f}", f"{s['p90_ms']:.2f}",
                     f"{s['p99_ms']:.2f}", f"{s['images_per_s']:.1f}",
                     "-" if c.ratio_to_torch is None else f"{c.ratio_to_torch:.2f}",
                     "-" if c.of_floor() is None else f"{c.of_floor():.2f}", spread,
                     f"{c.cold_start_ms:.0f}", f"{c.memory_mb:.0f}"
                     + (f" / GPU {c.gpu_memory_mb:.0f}" if c.gpu_memory_mb is not None else ""),
                     status])
    return rows


def _precision_label(c: CaseResult) -> str:
    return c.configuration if c.graph == "dynamic" else f"{c.configuration} ({c.graph})"


TABLE_HEADER = ["asked", "ran on", "precision", "res", "batch", "threads", "p50 ms", "p90 ms",
                "p99 ms", "img/s", "× torch", "of floor", "session p50s", "cold ms", "mem MB", "status"]


def within_budget(report: BenchReport, budget_ms: float) -> list[dict[str, Any]]:
    """Per (provider that ran, precision, float precision) offered: the largest resolution
    whose p90 at batch 1 stays under the budget. The user's real question: what fits my
    latency budget here? Another float precision than f32 is offered only where it was
    judged on the photographs and passed (bench/run.py)."""
    best: dict[tuple[str, str, str], CaseResult] = {}
    offered = [c for c in report.cases if c.stats() and (
        c.float_precision == "f32" or (c.judged or {}).get("passed"))]
    for c in offered:
        if c.batch != 1 or c.stats()["p90_ms"] > budget_ms:
            continue
        key = (c.provider, c.precision, c.float_precision)
        area = c.resolution[0] * c.resolution[1]
        if key not in best or area > best[key].resolution[0] * best[key].resolution[1]:
            best[key] = c
    out = []
    for key in dict.fromkeys((c.provider, c.precision, c.float_precision) for c in offered):
        c = best.get(key)
        out.append({"provider": key[0], "precision": key[1], "float_precision": key[2],
                    "budget_ms": budget_ms, "resolution": list(c.resolution) if c else None,
                    "p90_ms": c.stats()["p90_ms"] if c else None})
    return out


def recommend(report: BenchReport, budget_ms: float) -> dict[str, Any] | None:
    """The engine x precision x resolution to deploy under the budget: the largest
    resolution any of them keeps within it (p90, batch 1), and among those the fastest. Every
    precision a bundle holds passed its check when it was added, so each is a candidate; a
    float precision other than f32 only where bench judged it and it passed."""
    fits = [b for b in within_budget(report, budget_ms) if b["resolution"]]
    if not fits:
        return None
    best = max(fits, key=lambda b: (b["resolution"][0] * b["resolution"][1], -b["p90_ms"]))
    return {k: best[k] for k in ("provider", "precision", "float_precision", "resolution",
                                 "p90_ms", "budget_ms")}


def _configuration(b: dict[str, Any]) -> str:
    fp = b.get("float_precision", "f32")
    return b["precision"] + ("" if fp == "f32" else
                             f" with {fp} for the rest (RuntimeOptions(float_precision={fp!r}))")


def budget_lines(report: BenchReport, budget_ms: float) -> list[str]:
    """within_budget in words, one line per provider and precision, then the recommendation."""
    lines = []
    for b in within_budget(report, budget_ms):
        fits = (f"up to {format_resolution(tuple(b['resolution']))} (p90 {b['p90_ms']:.1f} ms)"
                if b["resolution"] else "no measured resolution")
        lines.append(f"within {budget_ms:g} ms p90 at batch 1 on {b['provider']} "
                     f"{_configuration(b)}: {fits}")
    best = recommend(report, budget_ms)
    lines.append(f"recommended within {budget_ms:g} ms: {best['provider']} {_configuration(best)} "
                 f"at {format_resolution(tuple(best['resolution']))} (p90 {best['p90_ms']:.1f} "
                 f"ms; the largest size that fits, then the fastest)" if best else
                 f"recommended within {budget_ms:g} ms: nothing measured fits")
    return lines


def plot(report: BenchReport, path: str | Path) -> Path:
    """Latency (p50) against token count, one line per provider / precision / batch (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vit_deploy.runtime.files import write_bytes_atomic

    patch = report.options.get("patch_size") or 1
    series: dict[tuple[str, str, int], list[tuple[int, float, str]]] = {}
    for c in report.cases:
        s = c.stats()
        if not s:
            continue
        tokens = (c.resolution[0] // patch) * (c.resolution[1] // patch)
        series.setdefault((c.provider, c.configuration, c.batch), []).append(
            (tokens, s["p50_ms"], f"{c.resolution[0]}x{c.resolution[1]}"))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for (provider, precision, batch), points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                label=f"{provider} {precision} b{batch}")
        for t, ms, label in points:
            ax.annotate(label, (t, ms), fontsize=6, alpha=0.6, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("patch tokens (H/P × W/P)")
    ax.set_ylabel("latency p50 (ms)")
    env = report.environment
    ax.set_title(f"{Path(report.bundle).name}: {env.get('cpu')}, {env.get('cores')} cores"
                 + (f", {env['gpu']}" if env.get("gpu") else ""), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return write_bytes_atomic(path, buf.getvalue())


def status_notes(report: BenchReport) -> list[str]:
    """Each distinct reason a case did not run as asked, once; and a machine that did not
    give the threads their cores."""
    notes: dict[str, None] = {}
    for c in report.cases:
        if ":" in c.status:
            notes[f"{c.requested}: {c.status}"] = None
    probe = report.environment.get("thread_scaling")
    if probe and min(probe["before"], probe["after"]) < 0.75 * probe["threads"]:
        notes[f"{probe['threads']} threads got {probe['before']:.2f} (before) and "
              f"{probe['after']:.2f} (after) cores' worth of an int8 matmul: this machine "
              f"shares its cores (other load, or vCPUs on shared physical cores); its "
              f"latencies move with that, so compare cases within one run and repeat"] = None
    return list(notes)


def _peaks_text(env: dict[str, Any]) -> str:
    """bench --floor: the GEMM peaks the floors come from, per thread count."""
    peaks = env.get("gemm_peaks") or {}
    parts = []
    for threads, p in peaks.items():
        text = (f"{threads} thread(s): ORT fp32 {p['fp32']['gflops']:.0f} GFLOP/s, int8 "
                f"{p['int8']['gflops']:.0f} GOP/s")
        if "openvino-int8" in p:
            text += ", OpenVINO " + ", ".join(
                f"{kind} {p[f'openvino-{kind}']['gflops']:.0f} ({p[f'openvino-{kind}'].get('kernel', '?')})"
                for kind in ("fp32", "bf16", "int8") if f"openvino-{kind}" in p)
        parts.append(f"{text} ({'x'.join(map(str, p['fp32']['shape']))})")
    return f"; GEMM peaks (the floor: the better engine's) at {'; '.join(parts)}" if parts else ""


def _probe_text(env: dict[str, Any]) -> str:
    probe = env.get("thread_scaling")
    return (f"; {probe['threads']} threads = {probe['before']:.2f} / {probe['after']:.2f} "
            f"cores' worth (before / after)" if probe else "")


def _report_from_dict(data: Any, source: str) -> BenchReport:
    def need(ok: bool, where: str, what: str, got: Any) -> None:
        if not ok:
            raise ReportError(f"{source} is not a vit-deploy bench report (saved with --json): "
                              f"{where} must be {what}, got {str(got)[:60]!r}")

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    need(isinstance(data, dict), "the file", "a JSON object", type(data).__name__)
    need(isinstance(data.get("cases"), list), "'cases'", "a list", data.get("cases"))
    for key in ("environment", "options"):
        need(isinstance(data.get(key, {}), dict), repr(key), "an object", data.get(key))
    cases = []
    for i, c in enumerate(data["cases"]):
        at = f"case {i + 1}"
        need(isinstance(c, dict), at, "an object", c)
        for key in ("provider", "requested", "precision", "status"):
            need(isinstance(c.get(key), str), f"{at} {key!r}", "a string", c.get(key))
        res = c.get("resolution")
        need(isinstance(res, list) and len(res) == 2 and all(count(v) for v in res),
             f"{at} 'resolution'", "[height, width]", res)
        need(count(c.get("batch")), f"{at} 'batch'", "a positive integer", c.get("batch"))
        need(c.get("threads") is None or count(c["threads"]), f"{at} 'threads'",
             "a positive integer or null", c.get("threads"))
        for key in ("graph", "float_precision"):
            need(isinstance(c.get(key, ""), str), f"{at} {key!r}", "a string", c.get(key))
        judged = c.get("judged")
        need(judged is None or (isinstance(judged, dict) and isinstance(judged.get("passed"),
                                                                       bool)),
             f"{at} 'judged'", "null or an object with 'passed'", judged)
        for key in (*STATS, "cold_start_ms", "memory_mb", "gpu_memory_mb", "ratio_to_torch",
                    "floor_ms"):
            need(c.get(key) is None or number(c[key]), f"{at} {key!r}", "a number or null",
                 c.get(key))
        medians = c.get("session_medians_ms", [])
        need(isinstance(medians, list) and all(number(v) for v in medians),
             f"{at} 'session_medians_ms'", "a list of numbers", medians)
        cases.append(CaseResult(
            provider=c["provider"], requested=c["requested"], precision=c["precision"],
            resolution=(res[0], res[1]), batch=c["batch"], threads=c["threads"],
            session_medians_ms=[float(v) for v in medians], status=c["status"],
            cold_start_ms=float(c.get("cold_start_ms") or 0.0),
            memory_mb=float(c.get("memory_mb") or 0.0), gpu_memory_mb=c.get("gpu_memory_mb"),
            ratio_to_torch=c.get("ratio_to_torch"), graph=c.get("graph", "dynamic"),
            floor_ms=c.get("floor_ms"), float_precision=c.get("float_precision", "f32"),
            judged=judged,
            saved_stats={k: c[k] for k in STATS if c.get(k) is not None}))
    budget = data.get("budget")
    budget_ms = (budget[0].get("budget_ms") if isinstance(budget, list) and budget
                 and isinstance(budget[0], dict) else None)
    return BenchReport(str(data.get("bundle", "")), data.get("environment", {}),
                       data.get("options", {}), cases,
                       budget_ms=budget_ms if number(budget_ms) else None)
