"""Provider comparison: latency percentiles, throughput, cold start, memory.

Cases that are compared run in one process, interleaved run by run, each over several
fresh sessions (the same graph can land on latency levels ≈ 25 % apart from one session
to the next, DESIGN.md), so ratios between them survive a noisy machine.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError
from vit_deploy.runtime.manifest import dumps_strict, load_manifest
from vit_deploy.runtime.providers import CPU, parse_providers, short_name
from vit_deploy.runtime.session import RuntimeOptions, ViTSession
from vit_deploy.runtime.sizes import format_resolution, guard_memory

TORCH = "torch"  # the baseline's provider label
STATS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "runs", "images_per_s")


class ReportError(VitDeployError, ValueError):
    """A saved bench report that cannot be read: says which file, which field and why."""

    exit_code = BAD_INPUT


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    providers: tuple[str, ...] = ("cpu",)
    precisions: tuple[str, ...] = ("fp32",)
    resolutions: tuple[tuple[int, int], ...] = ()  # () -> the bundle's deploy resolution
    batches: tuple[int, ...] = (1,)
    threads: tuple[int | None, ...] = (None,)  # None: ONNX Runtime / PyTorch default
    warmup: int = 5
    runs: int = 30
    seconds: float | None = None  # time budget per (resolution, batch, threads) group
    sessions: int = 2  # fresh sessions per case, used in turn
    baseline_torch: bool = False
    fallback: bool = False  # allow a provider to fall back (reported), else unavailable
    # Idle sessions' spinning threads steal the cores from the session being timed when
    # several are interleaved (measured: int8 ViT-B/16 140 ms interleaved with spinning,
    # 68 ms without); None: off when more than one session is live, else ORT's default.
    spinning: bool | None = None
    io_binding: bool = False  # bind inputs/outputs to the provider's device (RuntimeOptions)
    # An edge target's bucket graphs (`vit-deploy target`) measured beside the dynamic graph
    # at the same sizes (default sizes: the target's buckets).
    target: str | None = None

    def __post_init__(self) -> None:
        for name in ("warmup", "runs", "sessions"):
            if getattr(self, name) < (0 if name == "warmup" else 1):
                raise ValueError(f"{name} must be >= {0 if name == 'warmup' else 1}, got "
                                 f"{getattr(self, name)}")
        if any(b < 1 for b in self.batches):
            raise ValueError(f"batch sizes must be >= 1, got {self.batches}")


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
    # The statistics of a report read back (BenchReport.from_json): latencies are not saved.
    saved_stats: dict[str, float] = field(repr=False, default_factory=dict)

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
        return d | self.stats()


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
        d = {"bundle": self.bundle, "environment": self.environment, "options": self.options,
             "cases": [c.to_dict() for c in self.cases]}
        if self.budget_ms is not None:
            d["budget"] = within_budget(self, self.budget_ms)
        return d

    def to_json(self) -> str:
        return dumps_strict(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "report") -> BenchReport:
        """A report saved with `bench --json`, every field checked (ReportError names the
        file, the case and the field). Latencies are not saved: `stats()` gives the saved
        percentiles."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ReportError(f"{source} is not a vit-deploy bench report (saved with "
                              f"--json): not JSON ({e})") from None
        return _report_from_dict(data, source)

    @classmethod
    def load(cls, path: str | Path) -> BenchReport:
        try:
            text = Path(path).read_bytes()
        except OSError as e:
            raise ReportError(f"cannot read bench report {str(path)!r}: "
                              f"{e.strerror or e}") from None
        return cls.from_json(text, source=repr(str(path)))

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
            f"interleaved; ORT spinning {spinning}{_probe_text(env)}", table,
            *status_notes(self),
            *(budget_lines(self, self.budget_ms) if self.budget_ms is not None else ()))

    def plot(self, path: str | Path) -> Path:
        return plot(self, path)

    def to_csv(self) -> str:
        rows = [c.to_dict() for c in self.cases]
        keys = ["provider", "requested", "precision", "resolution", "batch", "threads", "p50_ms",
                "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "runs", "images_per_s",
                "ratio_to_torch", "cold_start_ms", "memory_mb", "gpu_memory_mb", "status"]
        buf = io.StringIO()
        w = csv.DictWriter(buf, keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            r["resolution"] = f"{r['resolution'][0]}x{r['resolution'][1]}"
            w.writerow(r)
        return buf.getvalue()


def run_bench(bundle: str | Path, options: BenchOptions = BenchOptions(),
              progress: Callable[[int, int], None] | None = None) -> BenchReport:
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    cfg = manifest.config
    manifest.require_models(options.precisions)
    providers = [p.name for p in parse_providers(list(options.providers))]
    if options.target is not None:
        spec = manifest.target(options.target)
        manifest.require_models(options.precisions)
        missing = [p for p in options.precisions if p not in spec.precisions]
        if missing:
            raise ValueError(f"target {options.target!r} has no {missing} graphs; it has "
                             f"{list(spec.precisions)}")
    resolutions = options.resolutions or (manifest.target(options.target).resolutions
                                          if options.target else (manifest.deploy_resolution,))
    for hw in resolutions:
        manifest.require_size(hw)
    largest = max(resolutions, key=lambda hw: hw[0] * hw[1])
    guard_memory(*largest, cfg, batch=max(options.batches))
    groups = [(hw, b, t) for hw in resolutions for b in options.batches for t in options.threads]
    probe_threads = max((t or os.cpu_count() or 1) for t in options.threads)
    probe = probe_threads > 1 and (CPU in providers or options.baseline_torch)
    scaling_before = thread_scaling(probe_threads) if probe else None
    total = len(groups) * (options.runs if options.seconds is None else 1)
    done = 0
    cases: list[CaseResult] = []
    for hw, batch, threads in groups:
        x = np.random.default_rng(0).standard_normal((batch, cfg.in_chans, *hw), dtype=np.float32)
        runners: list[tuple[CaseResult, list[Callable[[], Any]]]] = []
        if options.baseline_torch:
            runners.append(_torch_runner(bundle, x, batch, hw, threads, options))
        for provider in providers:
            for precision in options.precisions:
                runners.append(_ort_runner(bundle, provider, precision, x, hw, batch, threads,
                                           options))
                if options.target is not None:
                    runners.append(_ort_runner(bundle, provider, precision, x, hw, batch, threads,
                                               options, target=options.target))
        live = [(c, fns) for c, fns in runners if fns]
        for _ in range(options.warmup):
            for _, fns in live:
                for fn in fns:
                    fn()
        per_session: dict[int, list[list[float]]] = {id(c): [[] for _ in fns] for c, fns in live}
        deadline = None if options.seconds is None else time.perf_counter() + options.seconds
        i = 0
        while (i < options.runs) if deadline is None else (time.perf_counter() < deadline or i < 3):
            for case, fns in live:  # interleaved: A B C A B C ...
                k = i % len(fns)
                t0 = time.perf_counter()
                fns[k]()
                dt = (time.perf_counter() - t0) * 1000
                case.latencies_ms.append(dt)
                per_session[id(case)][k].append(dt)
            i += 1
            if deadline is None:
                done += 1
                if progress:
                    progress(done, total)
        if deadline is not None:
            done += 1
            if progress:
                progress(done, total)
        for case, _ in live:
            case.session_medians_ms = [float(np.median(s)) for s in per_session[id(case)] if s]
        base = next((c for c, _ in live if c.provider == TORCH), None)
        for case, _ in runners:
            if base is not None and case.latencies_ms and case is not base:
                case.ratio_to_torch = case.stats()["p50_ms"] / base.stats()["p50_ms"]
            cases.append(case)
        del runners, live
    env = environment() | {"peak_rss_mb": round(rss_mb(peak=True), 1)}
    if probe:
        env["thread_scaling"] = {"threads": probe_threads, "before": round(scaling_before, 2),
                                 "after": round(thread_scaling(probe_threads), 2)}
    opts = asdict(options) | {"providers_resolved": [short_name(p) for p in providers],
                              "patch_size": cfg.patch_size,
                              "ort_spinning": _spinning(options)}
    return BenchReport(str(bundle), env, opts, cases)


def _ort_runner(bundle: Path, provider: str, precision: str, x: np.ndarray, hw, batch, threads,
                options: BenchOptions, target: str | None = None
                ) -> tuple[CaseResult, list[Callable[[], Any]]]:
    case = CaseResult(provider="", requested=short_name(provider), precision=precision,
                      resolution=tuple(hw), batch=batch, threads=threads,
                      graph=f"bucket:{target}" if target else "dynamic")
    fns: list[Callable[[], Any]] = []
    rss0 = rss_mb()
    gpu0 = gpu_memory_mb()
    try:
        for _ in range(options.sessions):
            t0 = time.perf_counter()
            s = ViTSession(bundle, provider=provider, precision=precision, fallback=options.fallback,
                           options=RuntimeOptions(threads=threads, verify=False,
                                                  spinning=_spinning(options),
                                                  io_binding=options.io_binding),
                           target=target or "none")
            if target and not (s.buckets and s.buckets.covers(hw)):
                raise ValueError(f"target {target!r} has no bucket at {hw[0]}x{hw[1]}")
            s.run(x)
            case.cold_start_ms = case.cold_start_ms or (time.perf_counter() - t0) * 1000
            case.provider = short_name(s.providers[0])
            if s.fallback_reason:
                case.status = f"fell back: {s.fallback_reason}"
            elif s.split_batches and batch > 1:
                case.status = "ok: run image by image (dynamic int8 couples a batch)"
            fns.append(lambda s=s: s.run(x))
    except Exception as e:  # a provider that cannot run here is reported, not skipped
        case.status = f"unavailable: {str(e).splitlines()[0]}"
        case.provider = case.provider or "-"
        return case, []
    case.memory_mb = (rss_mb() - rss0) / options.sessions
    gpu1 = gpu_memory_mb()
    if gpu0 is not None and gpu1 is not None:
        case.gpu_memory_mb = (gpu1 - gpu0) / options.sessions
    return case, fns


def _spinning(options: BenchOptions) -> bool | None:
    if options.spinning is not None:
        return options.spinning
    live = (options.sessions * len(options.providers) * len(options.precisions)
            * (2 if options.target else 1))
    return False if live + options.baseline_torch > 1 else None


def _torch_runner(bundle: Path, x: np.ndarray, batch: int, hw, threads,
                  options: BenchOptions) -> tuple[CaseResult, list[Callable[[], Any]]]:
    case = CaseResult(provider=TORCH, requested=TORCH, precision="fp32", resolution=tuple(hw),
                      batch=batch, threads=threads)
    try:
        import torch

        from vit_deploy.export.checkpoints import load_model
    except ImportError:
        case.status = "unavailable: PyTorch is not installed (pip install 'vit-deploy[export]')"
        return case, []
    manifest = load_manifest(bundle, verify=False)
    if manifest.weights_file is None:
        case.status = "unavailable: the bundle holds no PyTorch weights"
        return case, []
    weights = manifest.weights_file
    rss0 = rss_mb()
    t0 = time.perf_counter()
    torch.set_num_threads(threads or (os.cpu_count() or 1))
    model = load_model(manifest.resolve(bundle, weights))  # refused if it leaves the bundle
    xt = torch.from_numpy(x)

    def run() -> Any:
        with torch.inference_mode():
            return model(xt)

    run()
    case.cold_start_ms = (time.perf_counter() - t0) * 1000
    case.memory_mb = rss_mb() - rss0
    return case, [run]


def rss_mb(*, peak: bool = False) -> float:
    """Resident set size of this process now (or its peak), in MB (Linux /proc; elsewhere
    the peak from getrusage)."""
    key = "VmHWM:" if peak else "VmRSS:"
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_memory_mb() -> float | None:
    """Used memory of GPU 0 from nvidia-smi, or None where there is no NVIDIA GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits", "-i", "0"], capture_output=True, text=True, timeout=10)
        return float(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def environment() -> dict[str, Any]:
    """Where the numbers came from: CPU, flags, cores, GPU, library versions."""
    import onnxruntime as ort

    env: dict[str, Any] = {"machine": platform.machine(), "system": platform.system(),
                           "python": platform.python_version(), "cores": os.cpu_count(),
                           "onnxruntime": ort.__version__,
                           "ort_providers_listed": ort.get_available_providers()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
        flags = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)
        env["cpu"] = model.group(1) if model else platform.processor()
        have = set(flags.group(1).split()) if flags else set()
        env["cpu_flags"] = sorted(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                                              "avx_vnni", "amx_int8", "amx_bf16", "fma") if f in have)
    except OSError:
        env["cpu"] = platform.processor()
    for mod in ("onnx", "torch", "numpy"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            env[mod] = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        env["gpu"] = out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        env["gpu"] = None
    return env


def format_table(report: BenchReport) -> list[list[str]]:
    rows = []
    for c in report.cases:
        s = c.stats()
        res = f"{c.resolution[0]}x{c.resolution[1]}"
        status = c.status.split(":")[0] + (" (see below)" if ":" in c.status else "")
        if not s:
            rows.append([c.requested, c.provider, _precision_label(c), res, str(c.batch),
                         str(c.threads or "default"), "-", "-", "-", "-", "-", "-", "-", "-",
                         status])
            continue
        spread = (f"{min(c.session_medians_ms):.1f}-{max(c.session_medians_ms):.1f}"
                  if c.session_medians_ms else "-")
        rows.append([c.requested, c.provider, _precision_label(c), res, str(c.batch),
                     str(c.threads or "default"), f"{s['p50_ms']:.2f}", f"{s['p90_ms']:.2f}",
                     f"{s['p99_ms']:.2f}", f"{s['images_per_s']:.1f}",
                     "-" if c.ratio_to_torch is None else f"{c.ratio_to_torch:.2f}", spread,
                     f"{c.cold_start_ms:.0f}", f"{c.memory_mb:.0f}"
                     + (f" / GPU {c.gpu_memory_mb:.0f}" if c.gpu_memory_mb is not None else ""),
                     status])
    return rows


def _precision_label(c: CaseResult) -> str:
    return c.precision if c.graph == "dynamic" else f"{c.precision} ({c.graph})"


TABLE_HEADER = ["asked", "ran on", "precision", "res", "batch", "threads", "p50 ms", "p90 ms",
                "p99 ms", "img/s", "× torch", "session p50s", "cold ms", "mem MB", "status"]


def within_budget(report: BenchReport, budget_ms: float) -> list[dict[str, Any]]:
    """Per (provider that ran, precision): the largest resolution whose p90 at batch 1 stays
    under the budget. The user's real question: what fits my latency budget here?"""
    best: dict[tuple[str, str], CaseResult] = {}
    for c in report.cases:
        s = c.stats()
        if c.batch != 1 or not s or s["p90_ms"] > budget_ms:
            continue
        key = (c.provider, c.precision)
        area = c.resolution[0] * c.resolution[1]
        if key not in best or area > best[key].resolution[0] * best[key].resolution[1]:
            best[key] = c
    out = []
    for (provider, precision) in dict.fromkeys((c.provider, c.precision) for c in report.cases
                                               if c.stats()):
        c = best.get((provider, precision))
        out.append({"provider": provider, "precision": precision, "budget_ms": budget_ms,
                    "resolution": list(c.resolution) if c else None,
                    "p90_ms": c.stats()["p90_ms"] if c else None})
    return out


def budget_lines(report: BenchReport, budget_ms: float) -> list[str]:
    """within_budget in words, one line per provider and precision."""
    lines = []
    for b in within_budget(report, budget_ms):
        fits = (f"up to {format_resolution(tuple(b['resolution']))} (p90 {b['p90_ms']:.1f} ms)"
                if b["resolution"] else "no measured resolution")
        lines.append(f"within {budget_ms:g} ms p90 at batch 1 on {b['provider']} "
                     f"{b['precision']}: {fits}")
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
        series.setdefault((c.provider, c.precision, c.batch), []).append(
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


def _probe_text(env: dict[str, Any]) -> str:
    probe = env.get("thread_scaling")
    return (f"; {probe['threads']} threads = {probe['before']:.2f} / {probe['after']:.2f} "
            f"cores' worth (before / after)" if probe else "")


def int8_gemm(threads: int, size: int) -> tuple[Any, dict[str, np.ndarray]]:
    """An ONNX Runtime CPU session running one size³ u8 × s8 MatMulInteger (idle threads
    not spinning), and its input."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (size, size), dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "gemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [size, size])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session, {"a": rng.integers(0, 256, (size, size), dtype=np.uint8)}


def thread_scaling(threads: int, *, size: int = 1024, repeats: int = 15,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """How many cores' worth `threads` get right now: an int8 matmul's best time on one
    thread ÷ on `threads`, back to back. Measured on a 2-vCPU cloud guest: 2.0 at some
    moments and 0.9-1.2 at others, minute to minute (the second vCPU shared a physical
    core with another guest), and every model's latency moved with it (docs/cpu-speed.md)."""
    best = []
    for n in (1, threads):
        session, feed = int8_gemm(n, size)
        session.run(None, feed)
        times = []
        for _ in range(repeats):
            t0 = clock()
            session.run(None, feed)
            times.append(clock() - t0)
        best.append(min(times))
    return best[0] / best[1]


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
        need(isinstance(c.get("graph", "dynamic"), str), f"{at} 'graph'", "a string",
             c.get("graph"))
        for key in (*STATS, "cold_start_ms", "memory_mb", "gpu_memory_mb", "ratio_to_torch"):
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
            saved_stats={k: c[k] for k in STATS if c.get(k) is not None}))
    budget = data.get("budget")
    budget_ms = (budget[0].get("budget_ms") if isinstance(budget, list) and budget
                 and isinstance(budget[0], dict) else None)
    return BenchReport(str(data.get("bundle", "")), data.get("environment", {}),
                       data.get("options", {}), cases,
                       budget_ms=budget_ms if number(budget_ms) else None)


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
