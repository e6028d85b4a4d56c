"""Provider comparison: latency percentiles, throughput, cold start, memory.

ONNX Runtime (and OpenVINO: provider `openvino`) cases that are compared run in one
process, interleaved run by run, each over several fresh sessions (the same graph can land
on latency levels about 25 % apart from one session to the next), so ratios between them
survive a noisy machine. The
PyTorch baseline runs alone in a fresh process first (bench/pytorch.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.bench.floor import (floor_ms, measure_openvino_peaks, measure_peaks, model_work,
                                    peak_shape)
from vit_deploy.reports.machine import environment, gpu_memory_mb, rss_mb, thread_scaling
from vit_deploy.bench.report import BenchReport, CaseResult
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.providers import CPU, OPENVINO, parse_providers, short_name
from vit_deploy.runtime.ort_session import FLOAT_PRECISIONS, RuntimeOptions
from vit_deploy.runtime.session import ViTSession
from vit_deploy.runtime.sizes import guard_memory

TORCH = "torch"  # the baseline's provider label

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
    # The floor per CPU case (bench/floor.py): fp32 / int8 GEMM peaks measured here, per
    # thread count, before the cases; each case's least possible time beside its p50.
    floor: bool = False
    # What is not int8 runs in, each measured (RuntimeOptions.float_precision): bf16 is
    # OpenVINO's on a CPU with AMX or AVX-512 BF16; another engine reports it unavailable.
    float_precisions: tuple[str, ...] = ("f32",)

    def __post_init__(self) -> None:
        unknown = [f for f in self.float_precisions if f not in FLOAT_PRECISIONS]
        if unknown or not self.float_precisions:
            raise ValueError(f"float precisions must be of {list(FLOAT_PRECISIONS)}, got "
                             f"{list(self.float_precisions)}")
        for name in ("warmup", "runs", "sessions"):
            if getattr(self, name) < (0 if name == "warmup" else 1):
                raise ValueError(f"{name} must be >= {0 if name == 'warmup' else 1}, got "
                                 f"{getattr(self, name)}")
        if any(b < 1 for b in self.batches):
            raise ValueError(f"batch sizes must be >= 1, got {self.batches}")


def run_bench(bundle: str | Path, options: BenchOptions = BenchOptions(),
              progress: Callable[[int, int], None] | None = None) -> BenchReport:
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    manifest.require_nchw("vit-deploy bench")
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
    probe = probe_threads > 1 and (CPU in providers or f"{OPENVINO}CPU" in providers
                                   or options.baseline_torch)
    scaling_before = thread_scaling(probe_threads) if probe else None
    peaks = _gemm_peaks(cfg, largest, options.threads) if options.floor else {}
    total = len(groups) * (options.runs if options.seconds is None else 1)
    done = 0
    cases: list[CaseResult] = []
    engines: dict[str, str] = {}  # what ran besides onnxruntime: {"openvino": "2026.4.1"}
    for hw, batch, threads in groups:
        x = np.random.default_rng(0).standard_normal((batch, cfg.in_chans, *hw), dtype=np.float32)
        runners: list[tuple[CaseResult, list[Callable[[], Any]]]] = []
        if options.baseline_torch:
            runners.append(_torch_runner(bundle, x, batch, hw, threads, options))
        for provider in providers:
            for precision in options.precisions:
                for float_precision in options.float_precisions:
                    runners.append(_ort_runner(bundle, provider, precision, x, hw, batch,
                                               threads, options, engines=engines,
                                               float_precision=float_precision))
                if options.target is not None:
                    runners.append(_ort_runner(bundle, provider, precision, x, hw, batch, threads,
                                               options, target=options.target, engines=engines))
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
        base = next((c for c, _ in runners if c.provider == TORCH and c.latencies_ms), None)
        for case, _ in runners:
            if base is not None and case.latencies_ms and case is not base:
                case.ratio_to_torch = case.stats()["p50_ms"] / base.stats()["p50_ms"]
            if peaks and case.latencies_ms and case.provider in FLOOR_PROVIDERS:
                case.floor_ms = floor_ms(model_work(cfg, hw), case.precision, peaks[threads],
                                         batch)
            cases.append(case)
        del runners, live
    env = environment() | engines | {"peak_rss_mb": round(rss_mb(peak=True), 1)}
    if peaks:
        env["gemm_peaks"] = {str(t or "default"): {k: v.to_dict() for k, v in p.items()}
                             for t, p in peaks.items()}
    if probe:
        env["thread_scaling"] = {"threads": probe_threads, "before": round(scaling_before, 2),
                                 "after": round(thread_scaling(probe_threads), 2)}
    opts = asdict(options) | {"providers_resolved": [short_name(p) for p in providers],
                              "patch_size": cfg.patch_size,
                              "ort_spinning": _spinning(options)}
    return BenchReport(str(bundle), env, opts, cases)


# What the floors are for: the CPU's own kernels (a GPU's floor is another question)
FLOOR_PROVIDERS = frozenset({"cpu", "openvino", TORCH})


def _gemm_peaks(cfg, resolution, threads: tuple[int | None, ...]) -> dict:
    """{threads: {"fp32": GemmPeak, "int8": GemmPeak, "openvino-fp32": ..., "openvino-bf16",
    "openvino-int8"}}: the model's MLP product at the largest size measured, with each thread
    count the cases use (None: all cores), through ONNX Runtime and, where it is installed,
    OpenVINO (an engine on the CPU's tile / VNNI units: the floor is the better of the two)."""
    shape = peak_shape(cfg, resolution)
    return {t: measure_peaks(threads=t or os.cpu_count() or 1, shape=shape)
            | measure_openvino_peaks(threads=t or os.cpu_count() or 1, shape=shape)
            for t in threads}


def _ort_runner(bundle: Path, provider: str, precision: str, x: np.ndarray, hw, batch, threads,
                options: BenchOptions, target: str | None = None,
                engines: dict[str, str] | None = None, float_precision: str = "f32"
                ) -> tuple[CaseResult, list[Callable[[], Any]]]:
    """A provider's case: its sessions (ONNX Runtime's, or OpenVINO's), each run once; the
    engine that ran and its version go into `engines` (onnxruntime's is in every report)."""
    case = CaseResult(provider="", requested=short_name(provider), precision=precision,
                      resolution=tuple(hw), batch=batch, threads=threads,
                      graph=f"bucket:{target}" if target else "dynamic",
                      float_precision=float_precision)
    fns: list[Callable[[], Any]] = []
    import gc

    gc.collect()  # the previous group's sessions go now, not while this one is measured
    rss0 = rss_mb()
    gpu0 = gpu_memory_mb()
    try:
        for _ in range(options.sessions):
            t0 = time.perf_counter()
            s = ViTSession(bundle, provider=provider, precision=precision, fallback=options.fallback,
                           options=RuntimeOptions(threads=threads, verify=False,
                                                  spinning=_spinning(options),
                                                  io_binding=options.io_binding,
                                                  float_precision=float_precision),
                           target=target or "none")
            if target and not (s.buckets and s.buckets.covers(hw)):
                raise ValueError(f"target {target!r} has no bucket at {hw[0]}x{hw[1]}")
            s.run(x)
            case.cold_start_ms = case.cold_start_ms or (time.perf_counter() - t0) * 1000
            case.provider = short_name(s.providers[0])
            name, _, version = s.engine.partition(" ")
            if engines is not None and name != "onnxruntime":
                engines[name] = version
            if s.fallback_reason:
                case.status = f"fell back: {s.fallback_reason}"
            elif s.split_batches and batch > 1:
                case.status = "ok: run image by image (dynamic int8 couples a batch)"
            if float_precision != "f32" and not fns:  # offered only where it holds
                _judge_on_photos(case, s, bundle, hw)
            fns.append(lambda s=s: s.run(x))
    except Exception as e:  # a provider that cannot run here is reported, not skipped
        case.status = f"unavailable: {str(e).splitlines()[0]}"
        case.provider = case.provider or "-"
        return case, []
    case.memory_mb = max(0.0, rss_mb() - rss0) / options.sessions  # growth; never negative
    gpu1 = gpu_memory_mb()
    if gpu0 is not None and gpu1 is not None:
        case.gpu_memory_mb = (gpu1 - gpu0) / options.sessions
    return case, fns


def _spinning(options: BenchOptions) -> bool | None:
    if options.spinning is not None:
        return options.spinning
    live = (options.sessions * len(options.providers) * len(options.precisions)
            * (len(options.float_precisions) + (1 if options.target else 0)))
    return False if live > 1 else None  # the torch baseline runs in its own process


def _torch_runner(bundle: Path, x: np.ndarray, batch: int, hw, threads,
                  options: BenchOptions) -> tuple[CaseResult, list[Callable[[], Any]]]:
    """The PyTorch eager baseline, measured alone in a fresh process (bench/pytorch.py) with
    the same input, threads and runs: its latencies come back filled in, and it takes no
    part in the interleaved rounds (in one process with ONNX Runtime it ran 20-45x slow)."""
    import importlib.util
    import json
    import subprocess
    import sys

    case = CaseResult(provider=TORCH, requested=TORCH, precision="fp32", resolution=tuple(hw),
                      batch=batch, threads=threads)
    if importlib.util.find_spec("torch") is None:
        case.status = "unavailable: PyTorch is not installed (pip install 'vit-deploy[export]')"
        return case, []
    argv = [str(bundle), str(hw[0]), str(hw[1]), str(batch),
            "default" if threads is None else str(threads), str(options.warmup),
            str(options.runs), "none" if options.seconds is None else str(options.seconds)]
    r = subprocess.run([sys.executable, "-m", "vit_deploy.bench.pytorch", *argv],
                       capture_output=True, text=True)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        why = (r.stderr.strip().splitlines() or ["no output"])[-1]
        case.status = f"unavailable: the PyTorch process failed ({why[:200]})"
        return case, []
    out = json.loads(lines[-1])
    if out["status"] != "ok":
        case.status = out["status"]
        return case, []
    case.latencies_ms = out["latencies_ms"]
    case.session_medians_ms = [float(np.median(out["latencies_ms"]))]
    case.cold_start_ms, case.memory_mb = out["cold_start_ms"], out["memory_mb"]
    case.status = "ok: timed alone in its own process"
    return case, []


def _judge_on_photos(case: CaseResult, session: ViTSession, bundle: Path,
                     hw: tuple[int, int]) -> None:
    """A case run in another float precision, judged as every precision is: the photographs
    shipped with the package (held out from calibration), each whole at the case's size,
    against the bundle's fp32 graph, by the policy of the case's precision."""
    from vit_deploy.precisions.photos import fp32_photo_batches, judge_photos

    x, refs = fp32_photo_batches(bundle, load_manifest(bundle, verify=False), [hw])[hw]
    outs = session.run_all(x)
    cases = judge_photos(refs, {k: outs[k] for k in refs}, resolution=hw,
                         precision=case.precision)
    worst = min(cases, key=lambda c: c.cosine_min - c.floor)
    case.judged = {"on": f"{len(x)} photographs shipped with vit-deploy, held out from "
                         f"calibration, against fp32", "output": worst.output,
                   "cosine_min": worst.cosine_min, "floor": worst.floor,
                   "passed": all(c.passed for c in cases)}
    if not case.judged["passed"]:
        case.status = (f"ok: not offered: {case.configuration} is outside the "
                       f"{case.precision} policy on the shipped photographs ({worst.output} "
                       f"cosine {worst.cosine_min:.5f} < {worst.floor})")
