"""Throughput of the ways to run a bundle over many images: `vit-deploy serve` (one
process), `vit-deploy serve --ray` with 1 and 2 replicas (Ray Serve), and the batch job
`vit-deploy embed` (Ray Data), on one local Ray cluster started here.

    python benchmarks/ray_throughput.py BUNDLE [--images 256] [--concurrency 8]
        [--cpus 4] [--cpus-per-replica 1] [--batch 8] [--json FILE]

The online modes get the same v2 requests (one image's preprocessed pixels as binary FP32,
`tritonclient.http`, one client per thread, `--concurrency` threads, `--images` requests);
the batch job embeds `--images` PNGs of 640x480 written to a temporary folder. Reports
images/s and, online, p50 / p99 latency, as lines and a markdown table.

Starts a Ray head here (`ray start --head`, its own temp dir and token) and kills its
processes at the end, whatever happened. Do not run it beside other work: it measures the
machine."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.preprocess import Preprocess

BIN = Path(sys.executable).parent
NAME = "vit"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def cluster(cpus: int, env: dict[str, str]) -> Iterator[str]:
    """A one-node Ray cluster (ray start --head) for the run; yields its address."""
    temp = tempfile.mkdtemp(prefix="vdbench", dir="/tmp")
    gcs = _free_port()
    try:
        subprocess.run([BIN / "ray", "start", "--head", "--port", str(gcs), "--num-cpus",
                        str(cpus), "--temp-dir", temp, "--include-dashboard", "false",
                        "--disable-usage-stats"], env=env, check=True, capture_output=True,
                       timeout=300)
        yield f"127.0.0.1:{gcs}"
    finally:
        marker = re.compile(rf"{re.escape(temp)}|:{gcs}\b")
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and marker.search(
                        (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, UnicodeDecodeError):
                pass
        shutil.rmtree(temp, ignore_errors=True)


@contextmanager
def server(args: list[str], env: dict[str, str], log: Path) -> Iterator[str]:
    """`vit-deploy serve ... -q` in a subprocess; yields its URL once it answers."""
    with open(log, "w") as err:
        proc = subprocess.Popen([BIN / "vit-deploy", "serve", *args, "--name", NAME, "-q"],
                                env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            url = proc.stdout.readline().strip()
            if not url.startswith("http://"):
                raise SystemExit(f"serve did not start ({' '.join(args)}): see {log}")
            deadline = time.monotonic() + 120
            while httpx.get(f"{url}/v2/models/{NAME}/ready", timeout=10).status_code != 200:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{url} never became ready")
                time.sleep(0.5)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)  # serve --ray undeploys on SIGTERM
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def online(url: str, pixels: np.ndarray, requests: int, concurrency: int) -> dict:
    import tritonclient.http as oip

    local = threading.local()

    def one(_: int) -> float:
        if not hasattr(local, "client"):
            local.client = oip.InferenceServerClient(url.removeprefix("http://"),
                                                     network_timeout=300)
        inp = oip.InferInput("pixel_values", list(pixels.shape), "FP32")
        inp.set_data_from_numpy(pixels, binary_data=True)
        t0 = time.perf_counter()
        local.client.infer(NAME, [inp], outputs=[oip.InferRequestedOutput("logits")])
        return (time.perf_counter() - t0) * 1000

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(concurrency)))  # warm-up: a connection per thread
        t0 = time.perf_counter()
        lat = sorted(pool.map(one, range(requests)))
    wall = time.perf_counter() - t0
    return {"images_per_s": requests / wall, "p50_ms": statistics.median(lat),
            "p99_ms": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]}


def batch_job(bundle: str, folder: Path, address: str, env: dict[str, str], batch: int,
              actors: int, cpus: float) -> dict:
    out = folder.parent / "features.parquet"
    t0 = time.perf_counter()
    subprocess.run([BIN / "vit-deploy", "embed", bundle, str(folder), "--out", str(out),
                    "--ray", address, "--batch", str(batch), "--actors", str(actors),
                    "--cpus-per-actor", str(cpus), "--force", "-q"], env=env, check=True,
                   capture_output=True, timeout=3600)
    wall = time.perf_counter() - t0
    n = len(list(folder.iterdir()))
    return {"images_per_s": n / wall, "p50_ms": None, "p99_ms": None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2,
                   help="CPUs the Ray head offers")
    p.add_argument("--cpus-per-replica", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=8, help="max batch (online), --batch (job)")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args()
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                        "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    work = Path(tempfile.mkdtemp(prefix="vdbench-work"))
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(buf, "PNG")
    pixels = Preprocess.from_manifest(load_manifest(args.bundle, verify=False))(
        buf.getvalue())[None]
    images = work / "images"
    images.mkdir()
    for i in range(args.images):
        (images / f"{i:05d}.png").write_bytes(buf.getvalue())
    common = ["--max-batch", str(args.batch), "--max-wait-ms", "5"]
    results: dict[str, dict] = {}
    try:
        with server([args.bundle, "--port", "0", *common], env, work / "serve.log") as url:
            results["serve"] = online(url, pixels, args.images, args.concurrency)
        with cluster(args.cpus, env) as address:
            for replicas in (1, 2):
                with server([args.bundle, "--port", "0", "--ray", address, "--replicas",
                             str(replicas), "--cpus-per-replica", str(args.cpus_per_replica),
                             *common], env, work / f"ray{replicas}.log") as url:
                    results[f"serve --ray, {replicas} replica(s)"] = online(
                        url, pixels, args.images, args.concurrency)
            results["embed (Ray Data)"] = batch_job(
                args.bundle, images, address, env, args.batch,
                max(1, int(args.cpus / 2 / args.cpus_per_replica)), args.cpus_per_replica)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.bundle}: {args.images} images of 640x480, concurrency {args.concurrency}, "
          f"max batch {args.batch}, {args.cpus} CPUs for Ray")
    print("\n| mode | images/s | p50 ms | p99 ms |\n|---|---|---|---|")
    for mode, r in results.items():
        p50 = f"{r['p50_ms']:.1f}" if r["p50_ms"] is not None else "-"
        p99 = f"{r['p99_ms']:.1f}" if r["p99_ms"] is not None else "-"
        print(f"| {mode} | {r['images_per_s']:.1f} | {p50} | {p99} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
