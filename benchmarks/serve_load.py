"""Load on `vit-deploy serve` over loopback: requests/s and latency percentiles.

    python benchmarks/serve_load.py BUNDLE --concurrency 1,8 --requests 32 [--precision int8]

Starts the server on a loopback port the OS picks, sends PNG images from `concurrency` threads,
reports requests/s, p50 / p99 latency and how the server batched them, then stops it.
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
from PIL import Image


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    args = p.parse_args()
    proc = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "serve", args.bundle,
                             "--port", "0", "--precision", args.precision,
                             "--max-batch", str(args.max_batch), "--max-wait-ms",
                             str(args.max_wait_ms)], stdout=subprocess.PIPE, text=True)
    try:
        # `serve` prints its URL (the port the OS chose) once the socket listens
        line = proc.stdout.readline()
        found = re.search(r" on (http://\S+)", line)
        if not found:
            raise SystemExit(f"serve did not start: {line!r}")
        url = found.group(1)
        buf = io.BytesIO()
        rng = np.random.default_rng(0)
        Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(buf, "PNG")
        image = buf.getvalue()
        client = httpx.Client(timeout=300)

        def one(_: int) -> float:
            t0 = time.perf_counter()
            r = client.post(f"{url}/predict", content=image, headers={"content-type": "image/png"})
            r.raise_for_status()
            return (time.perf_counter() - t0) * 1000

        one(0)  # warm-up
        print(f"{args.bundle} ({args.precision}), {args.requests} requests of a 640x480 PNG, "
              f"max batch {args.max_batch}, max wait {args.max_wait_ms} ms")
        for c in (int(v) for v in args.concurrency.split(",")):
            m0 = client.get(f"{url}/metrics").json()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                lat = sorted(pool.map(one, range(args.requests)))
            wall = time.perf_counter() - t0
            m1 = client.get(f"{url}/metrics").json()
            p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
            print(f"concurrency {c}: {args.requests / wall:.2f} requests/s, p50 "
                  f"{statistics.median(lat):.1f} ms, p99 {p99:.1f} ms, "
                  f"{m1['batches'] - m0['batches']} batches, largest {m1['max_batch_seen']}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
