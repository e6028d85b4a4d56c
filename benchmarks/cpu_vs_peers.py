"""CPU comparison across fresh processes: PyTorch eager vs our fp32 and int8 graphs.

    python benchmarks/cpu_vs_peers.py vit-B16-448 [more bundles ...] --res 224,448 \
        --processes 3 --runs 20 [--json out.json]

Each process loads every case, warms up, then runs them interleaved (A B C A B C ...)
and reports per-case medians; the parent quotes the median over processes and the
spread (min-max), the ratio to PyTorch (per process, then the median), and the fraction
of the hardware floor (the model's FLOPs / a matmul peak measured here, same threads).
OpenVINO is compared when installed (optional peer; not a dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def model_flops(cfg: dict, h: int, w: int) -> float:
    """Multiply-adds × 2 of one image: patch embedding, blocks (qkv, attention, proj, MLP), head."""
    P, D = cfg["patch_size"], cfg["width"]
    n = (h // P) * (w // P)
    t = n + cfg.get("class_token", True) + cfg.get("dist_token", False) + cfg.get("num_registers", 0)
    hidden = int(D * cfg["mlp_ratio"])
    per_block = 3 * t * D * D + 2 * t * t * D + t * D * D + 2 * t * D * hidden
    macs = n * cfg["in_chans"] * P * P * D + cfg["depth"] * per_block + D * max(1, cfg["num_classes"])
    return 2.0 * macs


def matmul_peak_gflops(threads: int, size: int = 2048, repeats: int = 10) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size ** 3 / best / 1e9


def worker(args: argparse.Namespace) -> None:
    """One fresh process: load every case, interleave, print JSON medians."""
    import torch

    from vit_deploy.export.checkpoints import load_model
    from vit_deploy.runtime import RuntimeOptions, ViTSession

    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    h, w = args.hw
    x = np.random.default_rng(0).standard_normal((1, 3, h, w), dtype=np.float32)
    cases = {}
    first = Path(args.bundles[0])
    model = load_model(first / "weights.safetensors")
    xt = torch.from_numpy(x)

    def torch_run():
        with torch.inference_mode():
            model(xt)
    cases["pytorch eager fp32"] = torch_run
    opts = RuntimeOptions(verify=False, threads=args.threads, spinning=False)
    for bundle in args.bundles:
        for precision in args.precisions:
            try:
                s = ViTSession(bundle, precision=precision, options=opts)
            except Exception as e:  # a bundle without this precision, or a static size
                print(f"skip {bundle} {precision}: {e}", file=sys.stderr)
                continue
            if s.input_shape[2:] != ["height", "width"] and list(s.input_shape[2:]) != [h, w]:
                continue
            cases[f"ort {precision} ({Path(bundle).name})"] = (lambda s=s: s.run(x))
    try:
        import openvino as ov  # optional peer

        core = ov.Core()
        compiled = core.compile_model(str(first / "model.onnx"), "CPU")
        cases["openvino fp32"] = lambda: compiled([x])
    except ImportError:
        pass
    times = {k: [] for k in cases}
    for _ in range(args.warmup):
        for fn in cases.values():
            fn()
    for _ in range(args.runs):
        for k, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) * 1000)
    out = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundles", nargs="+")
    p.add_argument("--res", default="224")
    p.add_argument("--precisions", default="fp32,int8")
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.precisions = args.precisions.split(",")
    if args.worker:
        args.hw = tuple(int(v) for v in args.worker.split("x"))
        worker(args)
        return
    manifest = json.loads((Path(args.bundles[0]) / "manifest.json").read_text())
    threads = args.threads or os.cpu_count()
    peak = matmul_peak_gflops(threads)
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    report = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "threads": threads,
              "matmul_peak_gflops": round(peak, 1), "results": {}}
    print(f"{report['date']} {cpu}, {threads} threads, fp32 matmul peak {peak:.0f} GFLOP/s")
    for res in args.res.split(","):
        h, w = (int(v) for v in (res.split("x") * 2)[:2])
        per_process = []
        for i in range(args.processes):
            cmd = [sys.executable, __file__, *args.bundles, "--worker", f"{h}x{w}",
                   "--precisions", ",".join(args.precisions), "--runs", str(args.runs),
                   "--warmup", str(args.warmup)] + (["--threads", str(args.threads)]
                                                    if args.threads else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            per_process.append(json.loads(out.stdout.strip().splitlines()[-1]))
        flops = model_flops(manifest["config"], h, w)
        floor_ms = flops / (peak * 1e9) * 1000
        print(f"\n{h}x{w}: {flops / 1e9:.1f} GFLOP, floor {floor_ms:.0f} ms at the matmul peak")
        print(f"| case | median ms | spread over {args.processes} processes | × torch | "
              f"floor / time |")
        print("|---|---|---|---|---|")
        rows = {}
        for case in per_process[0]:
            ms = [p[case] for p in per_process]
            ratio = statistics.median(p[case] / p["pytorch eager fp32"] for p in per_process)
            rows[case] = {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
                          "ratio_to_torch": ratio, "floor_fraction": floor_ms / statistics.median(ms)}
            r = rows[case]
            print(f"| {case} | {r['median_ms']:.1f} | {r['min_ms']:.1f}–{r['max_ms']:.1f} | "
                  f"{ratio:.2f} | {r['floor_fraction']:.2f} |")
        print(f"| fp32 floor (FLOPs ÷ peak) | {floor_ms:.1f} | | "
              f"{floor_ms / rows['pytorch eager fp32']['median_ms']:.2f} | 1 |")
        report["results"][f"{h}x{w}"] = {"gflop": flops / 1e9, "floor_ms": floor_ms, "cases": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
