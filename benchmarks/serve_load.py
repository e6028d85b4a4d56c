"""Load on `vit-deploy serve` over loopback: requests/s and latency percentiles, through
`/predict` and through the Open Inference Protocol (v2 infer, Triton's own client).

    python benchmarks/serve_load.py BUNDLE --concurrency 1,8 --requests 32 [--api predict,v2]

Starts the server on a loopback port the OS picks and sends, from `concurrency` threads:
- predict: a 640x480 PNG to POST /predict (the server decodes, preprocesses, classifies);
- v2: the same image's pixels, preprocessed once here with the bundle's own preprocessing,
  as a binary FP32 tensor to POST /v2/models/NAME/infer via `tritonclient.http` (one client
  per thread); the server runs the model and returns the raw logits.
Reports requests/s, p50 / p99 latency and how the server batched them, then a markdown
table of the same, and stops the server.
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
from PIL import Image

from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.preprocess import Preprocess

APIS = ("predict", "v2")


def _sender(api: str, url: str, name: str, image: bytes, pixels: np.ndarray
            ) -> Callable[[int], float]:
    """A function that sends one request and returns its latency in ms."""
    if api == "predict":
        client = httpx.Client(timeout=300)

        def predict(_: int) -> float:
            t0 = time.perf_counter()
            r = client.post(f"{url}/predict", content=image,
                            headers={"content-type": "image/png"})
            r.raise_for_status()
            return (time.perf_counter() - t0) * 1000

        return predict

    import tritonclient.http as oip

    local = threading.local()  # one client per thread: a client is one connection

    def infer(_: int) -> float:
        if not hasattr(local, "client"):
            local.client = oip.InferenceServerClient(url.removeprefix("http://"),
                                                     network_timeout=300)
        request = oip.InferInput("pixel_values", list(pixels.shape), "FP32")
        request.set_data_from_numpy(pixels, binary_data=True)
        t0 = time.perf_counter()
        local.client.infer(name, [request], outputs=[oip.InferRequestedOutput("logits")])
        return (time.perf_counter() - t0) * 1000

    return infer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--api", default="predict,v2", help=f"any of {','.join(APIS)}")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--name", default="vit", help="model name on the v2 endpoints")
    args = p.parse_args()
    apis = [a.strip() for a in args.api.split(",") if a.strip()]
    if not apis or set(apis) - set(APIS):
        raise SystemExit(f"--api takes {','.join(APIS)}, got {args.api!r}")
    proc = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "serve", args.bundle,
                             "--port", "0", "--precision", args.precision, "--name", args.name,
                             "--max-batch", str(args.max_batch), "--max-wait-ms",
                             str(args.max_wait_ms)], stdout=subprocess.PIPE, text=True)
    rows = []
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
        pixels = Preprocess.from_manifest(load_manifest(args.bundle, verify=False))(image)[None]
        stats = httpx.Client(timeout=300)
        print(f"{args.bundle} ({args.precision}), {args.requests} requests of a 640x480 PNG "
              f"(v2: its {pixels.shape[2]}x{pixels.shape[3]} pixels), max batch "
              f"{args.max_batch}, max wait {args.max_wait_ms} ms")
        senders = {api: _sender(api, url, args.name, image, pixels) for api in apis}
        for one in senders.values():
            one(0)  # warm-up
        for c in (int(v) for v in args.concurrency.split(",")):
            for api, one in senders.items():  # the APIs in turn, so both see the same machine
                m0 = stats.get(f"{url}/stats").json()
                t0 = time.perf_counter()
                with ThreadPoolExecutor(c) as pool:
                    lat = sorted(pool.map(one, range(args.requests)))
                wall = time.perf_counter() - t0
                m1 = stats.get(f"{url}/stats").json()
                p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
                row = (api, c, args.requests / wall, statistics.median(lat), p99,
                       m1["batches"] - m0["batches"], m1["max_batch_seen"])
                rows.append(row)
                print(f"{api} concurrency {c}: {row[2]:.2f} requests/s, p50 {row[3]:.1f} ms, "
                      f"p99 {row[4]:.1f} ms, {row[5]} batches, largest so far {row[6]}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print("\n| API | concurrency | requests/s | p50 ms | p99 ms | session runs |")
    print("|---|---|---|---|---|---|")
    for api, c, rps, p50, p99, batches, _ in rows:
        what = "POST /predict (PNG)" if api == "predict" else "v2 infer (tritonclient.http)"
        print(f"| {what} | {c} | {rps:.1f} | {p50:.1f} | {p99:.1f} | {batches} |")


if __name__ == "__main__":
    main()
