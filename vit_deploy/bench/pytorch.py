"""The PyTorch eager baseline of `bench --baseline torch`, timed alone in its own process.

Timed in the process that also holds ONNX Runtime sessions, PyTorch ran 20-45x slower
than alone (ViT-Ti/16 at 224: 832 ms and 340 ms against 18 ms): the two thread pools
fight over the same cores. So the baseline is measured as users run it: a fresh
interpreter, the same threads, input and run count, nothing else loaded; `bench` starts
this module before its ONNX Runtime sessions and reads one JSON line back.

    python -m vit_deploy.bench.pytorch BUNDLE H W BATCH THREADS WARMUP RUNS SECONDS
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def measure(bundle: Path, hw: tuple[int, int], batch: int, threads: int | None, warmup: int,
            runs: int, seconds: float | None) -> dict[str, Any]:
    import numpy as np
    import torch

    from vit_deploy.reports.machine import rss_mb
    from vit_deploy.export.checkpoints import load_model
    from vit_deploy.runtime.manifest import load_manifest

    manifest = load_manifest(bundle, verify=False)
    if manifest.weights_file is None:
        return {"status": "unavailable: the bundle holds no PyTorch weights"}
    x = np.random.default_rng(0).standard_normal((batch, manifest.config.in_chans, *hw),
                                                 dtype=np.float32)  # as bench's ORT cases
    torch.set_num_threads(threads or (os.cpu_count() or 1))
    rss0 = rss_mb()
    t0 = time.perf_counter()
    model = load_model(manifest.resolve(bundle, manifest.weights_file))
    xt = torch.from_numpy(x)

    def run() -> Any:
        with torch.inference_mode():
            return model(xt)

    run()
    cold = (time.perf_counter() - t0) * 1000
    memory = rss_mb() - rss0
    for _ in range(warmup):
        run()
    latencies = []
    deadline = None if seconds is None else time.perf_counter() + seconds
    while (len(latencies) < runs) if deadline is None else (
            time.perf_counter() < deadline or len(latencies) < 3):
        t = time.perf_counter()
        run()
        latencies.append((time.perf_counter() - t) * 1000)
    return {"status": "ok", "latencies_ms": latencies, "cold_start_ms": cold,
            "memory_mb": memory, "threads": torch.get_num_threads(), "pid": os.getpid()}


def main(argv: list[str]) -> int:
    bundle, h, w, batch, threads, warmup, runs, seconds = argv
    out = measure(Path(bundle), (int(h), int(w)), int(batch),
                  None if threads == "default" else int(threads), int(warmup), int(runs),
                  None if seconds == "none" else float(seconds))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
