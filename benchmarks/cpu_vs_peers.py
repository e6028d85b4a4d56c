"""CPU speed as users run it: one engine per fresh process, rounds interleaved.

    python benchmarks/cpu_vs_peers.py vit-B16-448 --res 224,448 --rounds 5 --runs 20 \
        [--engines torch,ort:fp32,ort:int8,ort:int8-static,openvino:fp32,openvino:int8-static] \
        [--graph NAME=file.onnx ...] [--batch 1,8] [--threads 2] [--json out.json]

Each round starts every engine in its own fresh Python process, in turn (the order
rotates from round to round); the process loads its one engine, warms up, times `--runs`
calls and reports their median. Per engine the table gives the median over rounds, the
spread (fastest and slowest round), every round's median (so a slow process is visible),
the ratio to PyTorch eager (per round, then the median) and the fraction of the hardware
floor: the model's operations ÷ the peak of a large fp32 matmul (PyTorch) and of a large
int8 matmul (ONNX Runtime's `MatMulInteger`, u8 × s8), each measured in its own fresh
process with the same threads. A probe process at the start of each round measures how
many cores' worth the threads really get (an int8 matmul on N threads vs one,
`vit_deploy.reports.machine.thread_scaling`): on virtual machines whose vCPUs share physical cores
with other guests this moves from minute to minute, and with it every engine's latency;
the report warns when it fell short.

Engines: `torch` (eager fp32 from the bundle's weights), `ort:PRECISION` (the bundle's
file through `ViTSession`, the runtime users embed; provider reported),
`runtime-openvino:PRECISION` and `runtime-openvino-dynamic:PRECISION` (the same runtime on its
OpenVINO engine: compiled per input shape, or one model with dynamic batch and grid),
`runtime-openvino-bf16:PRECISION` (per shape, RuntimeOptions.float_precision bf16), `ort-file:NAME`
(a graph given with `--graph NAME=path`, e.g. a lever under test), `openvino:fp32`,
`openvino:bf16`, `openvino:int8-static`, `openvino:int8-static-f32` (OpenVINO on our own
files, static shape, LATENCY hint, same threads; `fp32` and `-f32` pin OpenVINO's inference
precision to f32: on CPUs with AMX it would otherwise run everything that is not int8 in
bf16). OpenVINO is an optional peer (`pip install
'vit-deploy[peers]'`); its engines are skipped, and said so, when it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_ENGINES = "torch,ort:fp32,ort:int8,ort:int8-static,openvino:fp32,openvino:int8-static"


def model_ops(cfg: dict, h: int, w: int) -> dict[str, float]:
    """Operations (2 × multiply-adds) of one image: the linear layers (what int8 runs in
    int8: qkv, proj, fc1, fc2, head), the attention matmuls, the patch embedding and the
    position table's resampling (two small matrix products, one per axis)."""
    P, D = cfg["patch_size"], cfg["width"]
    gh, gw = h // P, w // P
    GH, GW = (s // P for s in cfg["img_size"])  # the position table's grid
    n = gh * gw
    t = n + cfg.get("class_token", True) + cfg.get("dist_token", False) + \
        cfg.get("num_registers", 0)
    hidden = int(D * cfg["mlp_ratio"])
    linear = cfg["depth"] * (4 * t * D * D + 2 * t * D * hidden) + D * max(1, cfg["num_classes"])
    attention = cfg["depth"] * 2 * t * t * D
    embed = n * cfg["in_chans"] * P * P * D
    position = (gh * GH * GW + gh * gw * GW) * D if cfg.get("pos_embed") == "learned" \
        else (gh * GH + gw * GW) * D
    return {"linear": 2.0 * linear, "attention": 2.0 * attention, "embed": 2.0 * embed,
            "position": 2.0 * position}


# ---------------------------------------------------------------- worker processes

def _peak_fp32(threads: int, size: int = 2048, repeats: int = 10) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size ** 3 / best / 1e9


def _peak_int8(threads: int, size: int = 2048, repeats: int = 10) -> float:
    from vit_deploy.reports.machine import int8_gemm

    s, feed = int8_gemm(threads, size)
    for _ in range(3):
        s.run(None, feed)
    best = min(_timed(lambda: s.run(None, feed)) for _ in range(repeats))
    return 2 * size ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _load_engine(engine: str, bundle: Path, graphs: dict[str, str], batch: int, h: int, w: int,
                 threads: int):
    """-> (run(x), what actually runs: provider / device / precision)."""
    kind, _, name = engine.partition(":")
    if kind == "torch":
        import torch

        from vit_deploy.export.checkpoints import load_model

        torch.set_num_threads(threads)
        model = load_model(bundle / "weights.safetensors").eval()

        def run(x):
            with torch.inference_mode():
                return model(torch.from_numpy(x))
        return run, f"PyTorch {torch.__version__} eager, {torch.get_num_threads()} threads"
    if kind in ("runtime-openvino", "runtime-openvino-dynamic", "runtime-openvino-bf16"):
        from vit_deploy.runtime import RuntimeOptions, ViTSession

        static = kind != "runtime-openvino-dynamic"
        s = ViTSession(bundle, precision=name, provider="openvino", options=RuntimeOptions(
            verify=False, threads=threads, static_shapes=static,
            float_precision="bf16" if kind == "runtime-openvino-bf16" else "f32"))
        engine_session = s._session
        return s.run, (f"vit-deploy's OpenVINO engine ({s.providers[0]}), "
                       f"{'compiled per shape' if static else 'one dynamic model'}, "
                       f"{engine_session.config}")
    if kind in ("ort", "ort-file"):
        from vit_deploy.runtime import RuntimeOptions, ViTSession

        source = bundle if kind == "ort" else Path(graphs[name])
        kwargs = {"precision": name} if kind == "ort" else {}
        s = ViTSession(source, options=RuntimeOptions(verify=False, threads=threads), **kwargs)
        if s.input_shape[2:] != ["height", "width"] and list(s.input_shape[2:]) != [h, w]:
            raise SystemExit(f"{engine}: the graph is fixed at {s.input_shape[2:]}, not {h}x{w}")
        import onnxruntime as ort

        return s.run, f"onnxruntime {ort.__version__} {s.providers[0]}"
    if kind == "openvino":
        from vit_deploy.runtime.providers import import_openvino_quietly

        ov = import_openvino_quietly()  # no usage event posted (docs/guarantees.md)

        # engine -> (our file, OpenVINO's inference precision for what is not int8; None:
        # its default, bf16 on CPUs with AMX)
        files = {"fp32": ("model.onnx", "f32"), "bf16": ("model.onnx", "bf16"),
                 "int8-static": ("model.int8-static.onnx", None),
                 "int8-static-f32": ("model.int8-static.onnx", "f32")}
        if name not in files:
            raise SystemExit(f"openvino engines are {sorted(files)}, got {name!r}")
        core = ov.Core()
        model = core.read_model(str(bundle / files[name][0]))
        model.reshape({model.inputs[0].get_any_name(): [batch, 3, h, w]})
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
        if files[name][1]:
            config["INFERENCE_PRECISION_HINT"] = files[name][1]
        compiled = core.compile_model(model, "CPU", config)
        precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        request = compiled.create_infer_request()

        def run(x):
            return request.infer([x])
        return run, f"OpenVINO {ov.__version__} CPU, inference precision {precision}"
    raise SystemExit(f"unknown engine {engine!r}")


def worker(args: argparse.Namespace) -> None:
    """One fresh process, one engine: load, warm up, time, print one JSON line."""
    h, w = args.hw
    threads = args.threads or os.cpu_count()
    if args.worker == "peak:fp32":
        print(json.dumps({"gops": _peak_fp32(threads)}))
        return
    if args.worker == "peak:int8":
        print(json.dumps({"gops": _peak_int8(threads)}))
        return
    if args.worker == "probe:threads":
        from vit_deploy.reports.machine import thread_scaling

        print(json.dumps({"scaling": thread_scaling(threads)}))
        return
    graphs = dict(g.split("=", 1) for g in args.graph)
    t0 = time.perf_counter()
    run, what = _load_engine(args.worker, Path(args.bundle), graphs, args.batch, h, w, threads)
    load_s = time.perf_counter() - t0
    x = np.random.default_rng(0).standard_normal((args.batch, 3, h, w), dtype=np.float32)
    for _ in range(args.warmup):
        run(x)
    times = [_timed(lambda: run(x)) * 1000 for _ in range(args.runs)]
    print(json.dumps({"median_ms": statistics.median(times), "min_ms": min(times),
                      "load_s": load_s, "runs": args.runs, "engine": what,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


# ---------------------------------------------------------------- parent

def _spawn(args: argparse.Namespace, engine: str, h: int, w: int, batch: int) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), args.bundle, "--worker", engine,
           "--hw", f"{h}x{w}", "--batch", str(batch), "--runs", str(args.runs),
           "--warmup", str(args.warmup)] + [f"--graph={g}" for g in args.graph] + \
        (["--threads", str(args.threads)] if args.threads else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        reason = (r.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"  {engine} at {h}x{w} batch {batch}: failed ({reason})", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def _available(engine: str) -> str | None:
    """Why an engine cannot run here (None: it can)."""
    if engine.split(":")[0] in ("openvino", "runtime-openvino", "runtime-openvino-dynamic",
                                "runtime-openvino-bf16"):
        import importlib.util

        if importlib.util.find_spec("openvino") is None:
            return "OpenVINO is not installed (pip install 'vit-deploy[openvino]')"
    return None


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or "unknown CPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--res", default="224")
    p.add_argument("--engines", default=DEFAULT_ENGINES)
    p.add_argument("--graph", action="append", default=[], metavar="NAME=PATH",
                   help="an extra ONNX graph, run as engine ort-file:NAME")
    p.add_argument("--batch", default="1", help="batch sizes, e.g. 1,8 (images/s reported)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--hw", default="224x224", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.hw = tuple(int(v) for v in args.hw.split("x"))
        args.batch = int(args.batch)
        worker(args)
        return
    bundle = Path(args.bundle)
    if not (bundle / "manifest.json").is_file():
        p.error(f"{args.bundle!r} is not a bundle (no manifest.json): expected a directory "
                f"written by vit-deploy export")
    manifest = json.loads((bundle / "manifest.json").read_text())
    engines = [e for e in args.engines.split(",") if e]
    for e in list(engines):
        why = _available(e)
        if why:
            print(f"skipping {e}: {why}", file=sys.stderr)
            engines.remove(e)
    threads = args.threads or os.cpu_count()
    peaks = {k: (_spawn(args, f"peak:{k}", 0, 0, 1) or {}).get("gops") for k in ("fp32", "int8")}
    if None in peaks.values():
        raise SystemExit("error: the matmul peaks could not be measured (see above)")
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": _cpu_name(), "threads": threads,
              "peak_gops": {k: round(v, 1) for k, v in peaks.items()}, "rounds": args.rounds,
              "runs": args.runs, "results": {}}
    print(f"{report['date']}, {report['cpu']}, {threads} threads; peaks in fresh processes: "
          f"fp32 matmul {peaks['fp32']:.0f} GFLOP/s (PyTorch), int8 matmul "
          f"{peaks['int8']:.0f} GOP/s (ORT MatMulInteger)")
    for res in args.res.split(","):
        h, w = (int(v) for v in (res.split("x") * 2)[:2])
        ops = model_ops(manifest["config"], h, w)
        for batch in (int(b) for b in args.batch.split(",")):
            rounds: dict[str, list[dict]] = {e: [] for e in engines}
            scaling = []  # one probe per round: is the machine giving us all its threads?
            for r in range(args.rounds):
                if threads > 1:
                    scaling.append(_spawn(args, "probe:threads", 0, 0, 1)["scaling"])
                order = engines[r % len(engines):] + engines[:r % len(engines)]
                for engine in order:
                    out = _spawn(args, engine, h, w, batch)
                    if out:
                        rounds[engine].append(out | {"round": r})
            key = f"{h}x{w} batch {batch}"
            report["results"][key] = _table(rounds, ops, peaks, batch, key, args.rounds)
            report["results"][key]["thread_scaling"] = scaling
            if scaling:
                print(f"{threads} threads gave this many cores' worth of int8 GEMM, probed at "
                      f"the start of each round: {', '.join(f'{v:.2f}' for v in scaling)}")
                if min(scaling) < 0.75 * threads:
                    print(f"warning: in {sum(v < 0.75 * threads for v in scaling)} of "
                          f"{len(scaling)} rounds the {threads} threads did not get "
                          f"{threads} cores' worth (other load, or vCPUs sharing physical "
                          f"cores): compare engines within a round, and medians over rounds")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


def _table(rounds: dict[str, list[dict]], ops: dict[str, float], peaks: dict[str, float],
           batch: int, key: str, n_rounds: int) -> dict:
    total = sum(ops.values()) * batch
    floor_fp32 = total / (peaks["fp32"] * 1e9) * 1000
    # int8 floor: linear layers at the int8 peak, the rest (attention, embedding) at fp32's
    floor_int8 = (ops["linear"] / (peaks["int8"] * 1e9) + (total / batch - ops["linear"]) /
                  (peaks["fp32"] * 1e9)) * batch * 1000
    torch_ms = {o["round"]: o["median_ms"] for o in rounds.get("torch", [])}
    print(f"\n{key}: {total / 1e9:.1f} GOP; floor fp32 {floor_fp32:.1f} ms, "
          f"int8 (linear layers in int8) {floor_int8:.1f} ms")
    print(f"| engine | what ran | median ms | spread ({n_rounds} processes) | each process | "
          f"× torch | images/s | floor ÷ time |")
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for engine, outs in rounds.items():
        if not outs:
            continue
        ms = [o["median_ms"] for o in outs]
        ratios = [o["median_ms"] / torch_ms[o["round"]] for o in outs if o["round"] in torch_ms]
        med = statistics.median(ms)
        floor = floor_int8 if "int8" in engine else floor_fp32  # name ort-file graphs *int8*
        row = {"engine": outs[0]["engine"], "median_ms": med, "min_ms": min(ms),
               "max_ms": max(ms), "per_process_ms": ms,
               "ratio_to_torch": statistics.median(ratios) if ratios else None,
               "images_per_s": 1000 * batch / med, "floor_fraction": floor / med,
               "load_s": statistics.median(o["load_s"] for o in outs),
               "peak_rss_mb": max(o["peak_rss_mb"] for o in outs)}
        rows[engine] = row
        ratio = f"{row['ratio_to_torch']:.2f}" if ratios else ""
        print(f"| {engine} | {row['engine']} | {med:.1f} | {min(ms):.1f}–{max(ms):.1f} | "
              f"{', '.join(f'{v:.0f}' for v in ms)} | {ratio} | {row['images_per_s']:.1f} | "
              f"{row['floor_fraction']:.2f} |")
    torch_med = rows.get("torch", {}).get("median_ms")
    for name, floor in (("fp32 floor", floor_fp32), ("int8 floor", floor_int8)):
        ratio = f"{floor / torch_med:.2f}" if torch_med else ""
        print(f"| {name} | operations ÷ peak | {floor:.1f} | | | {ratio} | | 1 |")
    return {"gop": total / 1e9, "floor_fp32_ms": floor_fp32, "floor_int8_ms": floor_int8,
            "engines": rows}


if __name__ == "__main__":
    main()
