"""Ray, on a real two-node cluster: a head and a second node started here as separate
processes (`ray start`), as an operator would. On it: `vit-deploy serve --ray` (Ray Serve
replicas) answers with the runtime's numbers and passes test_server_v2's tritonclient tests
unchanged (imported below: the same HTTP surface as `vit-deploy serve`); it answers again
after a replica is SIGKILLed under load; the config file `--write-config` writes is
deployed by Ray's own `serve deploy`; and `vit-deploy embed` (Ray Data) is killed mid-job,
resumed, and writes the runtime's outputs, one row per image.

The tests run in file order and share the cluster and the deployment (module fixtures)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from test_server_v2 import (NAME, _pixels, bundle, client, runtime,  # noqa: F401
                            test_an_unknown_model_is_404_through_tritonclient,
                            test_bad_requests_through_tritonclient, test_compressed_requests,
                            test_health_and_metadata_through_tritonclient,
                            test_infer_matches_the_runtime, test_plain_json_over_http,
                            test_outputs_default_to_all_in_binary_and_can_be_a_subset,
                            test_unknown_model_and_version_are_404_with_a_v2_error)
from vit_deploy.runtime.contract import FEATURES_NAME, LOGITS_NAME
from vit_deploy.ray.shards import parts_dir

pytestmark = pytest.mark.heavy

BIN = Path(sys.executable).parent
# Token authentication (Ray's default for new clusters) with a token of this run's own, so
# neither a token in ~/.ray nor its absence matters: the suite's (tests/conftest.py, set
# before Ray was imported here, which reads it once per process), else one of our own.
ENV = os.environ | {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
                    "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32)}
EXACT = 1e-6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str) -> None:
    done = subprocess.run([BIN / "ray", *args], env=ENV, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _ours(temp: str, gcs: int) -> set[int]:
    """Processes whose command line names our temp dir or our head's port (the client
    server names only that), and their descendants."""
    marker = re.compile(rf"{re.escape(temp)}|:{gcs}\b")
    parents: dict[int, int] = {}
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if marker.search(cmdline):
            found.add(int(entry.name))
    grown = True
    while grown:
        more = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= more
        grown = bool(more)
    return found - {os.getpid()}


@pytest.fixture(scope="module")
def cluster(request):
    """A head node and a second node (2 CPUs each), separate processes with their own
    temp dir; every process of theirs is killed afterwards, whatever happened. The bundle
    is exported while the head starts."""
    temp = tempfile.mkdtemp(prefix="vdray", dir="/tmp")  # Ray's socket paths must stay short
    gcs, dashboard = _free_port(), _free_port()
    patch = pytest.MonkeyPatch()
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):  # this process asks the state API
        patch.setenv(name, ENV[name])
    try:
        def start_nodes() -> None:
            _ray("start", "--head", "--port", str(gcs), "--num-cpus", "2", "--temp-dir", temp,
                 "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
                 "--object-store-memory", str(100 << 20), "--disable-usage-stats")
            _ray("start", "--address", f"127.0.0.1:{gcs}", "--num-cpus", "2", "--temp-dir",
                 temp, "--object-store-memory", str(100 << 20), "--disable-usage-stats")

        with ThreadPoolExecutor(1) as pool:  # the nodes start while the bundle is exported
            nodes = pool.submit(start_nodes)
            request.getfixturevalue("bundle")
            nodes.result(timeout=360)
        from ray.util.state import list_nodes

        state = f"http://127.0.0.1:{dashboard}"
        assert len(list_nodes(address=state, filters=[("state", "=", "ALIVE")])) == 2
        yield {"address": f"127.0.0.1:{gcs}", "state": state, "temp": temp}
    finally:
        patch.undo()
        for pid in _ours(temp, gcs):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def _start(args: list[str], stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([BIN / "vit-deploy", *args], env=ENV, stdout=subprocess.PIPE,
                            stderr=stderr, text=True)


def _wait_ready(url: str, name: str = NAME, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/models/{name}/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not serve {name} within {timeout} s")


@pytest.fixture(scope="module")
def served(cluster, bundle):  # noqa: F811
    """`vit-deploy serve --ray`: two replicas (half a CPU each) on the cluster."""
    port = _free_port()
    log = open(Path(cluster["temp"]) / "serve.log", "w+")  # not a pipe: nobody drains it
    proc = _start(["serve", str(bundle), "--ray", cluster["address"], "--port", str(port),
                   "--name", NAME, "--max-batch", "4", "--max-wait-ms", "20",
                   "--replicas", "2", "--cpus-per-replica", "0.5", "-q"], stderr=log)
    try:
        line = proc.stdout.readline()
        if not line.startswith("http://"):
            proc.kill()
            log.seek(0)
            raise RuntimeError(f"serve --ray did not start: {line!r} {log.read()[-3000:]}")
        yield {"url": line.strip(), "proc": proc, "port": port}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def url(served):
    """What test_server_v2's imported tests and fixtures (client) talk to."""
    _wait_ready(served["url"])
    return served["url"]


def _replicas(cluster) -> list:
    from ray.util.state import list_actors

    return [a for a in list_actors(address=cluster["state"], detail=True, limit=1000,
                                   filters=[("state", "=", "ALIVE")])
            if "ViTReplica" in a.class_name]


def test_two_replicas_on_two_nodes_answer_as_the_runtime(cluster, url, runtime):
    replicas = _replicas(cluster)
    assert len(replicas) == 2 and len({a.node_id for a in replicas}) == 2, replicas
    x = _pixels(2, seed=3)
    body = {"inputs": [{"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    r = httpx.post(f"{url}/v2/models/{NAME}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    got = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"])
           for o in r.json()["outputs"]}
    expected = runtime.run_all(x)
    for name in (LOGITS_NAME, FEATURES_NAME):
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=EXACT)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (50, 70, 3), np.uint8))
    path = Path(cluster["temp"]) / "one.png"
    image.save(path)
    r = httpx.post(f"{url}/predict", content=path.read_bytes(),
                   headers={"content-type": "image/png"}, timeout=30)
    assert r.status_code == 200, r.text
    top = runtime.predict(path)[0].top
    assert [t["index"] for t in r.json()["top"]] == [c.index for c in top]
    np.testing.assert_allclose([t["probability"] for t in r.json()["top"]],
                               [c.probability for c in top], rtol=0, atol=EXACT)
    r = httpx.post(f"{url}/embed", content=path.read_bytes(),  # vectors, as plain `serve`
                   headers={"content-type": "image/png"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["output"] == FEATURES_NAME and r.json()["similarity"] == "cosine"
    np.testing.assert_allclose(r.json()["embedding"], runtime.embed(path)[0], rtol=0,
                               atol=1e-6)
    r = httpx.post(f"{url}/predict", content=b"not an image",
                   headers={"content-type": "image/png"}, timeout=30)
    assert r.status_code == 400 and set(r.json()) == {"error"}
    assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"


def test_quiet_serve_prints_the_url_and_nothing_of_rays(served, cluster, url):
    """`serve --ray -q` printed Ray's own lines on stderr (the token notice, "Started Serve",
    "Application ... is ready"); now stdout holds the URL and stderr nothing at all."""
    log = (Path(cluster["temp"]) / "serve.log").read_text()
    assert served["url"].startswith("http://127.0.0.1:") and log == "", log[-2000:]


def test_requests_are_batched_by_ray_serve(url, runtime):
    x = _pixels(1, seed=9)
    body = {"inputs": [{"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: httpx.post(f"{url}/v2/models/{NAME}/infer", json=body,
                                                   timeout=60).status_code, range(24)))
    assert codes == [200] * 24
    seen = max(httpx.get(f"{url}/stats", timeout=10).json()["max_batch_seen"]
               for _ in range(6))  # each replica counts its own; ask a few times
    assert 1 < seen <= 4  # @serve.batch merged requests, never past --max-batch


def test_slow_bodies_are_cut_and_never_keep_health_out(served, url):
    """`serve --ray` lacked `serve`'s slow-body protection: 33 clients that sent headers and
    the first bytes of a body held every replica slot (2 replicas x 4 x --max-batch 4) and
    every endpoint waited, /health too; then, with the slow bodies cut after the rate's 5-s
    window, 40 of them still held a valid request about 5 s (plain `serve`: 0.1 s with 300).
    A replica takes as many requests at once as its queue holds (their bodies bounded in
    bytes) and cuts a body under the minimum rate (8 KiB/s over 5 s) with 408: with 48 such
    clients open, /health and a prediction answer well inside the window, and each slow
    client has its 408."""
    from test_server_hostile import _closed_by_server, _connect, _slow_openings

    slow = [_connect(served["port"], opening) for opening in _slow_openings(NAME) * 16]
    t0 = time.monotonic()
    time.sleep(1.0)  # every body is being read
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200
    x = _pixels(1, seed=3)
    r = httpx.post(f"{url}/v2/models/{NAME}/infer", timeout=30, json={"inputs": [
        {"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32",
         "data": x.ravel().tolist()}]})
    assert r.status_code == 200 and time.monotonic() - t0 < 3.5, time.monotonic() - t0
    closed, sent = _closed_by_server(slow, within=20.0)
    assert closed == len(slow), (closed, len(slow))
    assert all(d.startswith(b"HTTP/1.1 408") and b"minimum body rate" in d for d in sent), \
        Counter(d[:60] for d in sent)
    for s in slow:
        s.close()


def test_a_replica_killed_under_load_and_the_service_answers_again(cluster, url, runtime):
    x = _pixels(1, seed=4)
    expected = runtime.run_all(x)[LOGITS_NAME]
    body = {"inputs": [{"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    stop, codes = threading.Event(), Counter()

    def load() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                try:
                    r = http.post(f"{url}/v2/models/{NAME}/infer", json=body)
                except httpx.HTTPError:
                    codes["connection"] += 1
                    continue
                codes[r.status_code] += 1
                if r.status_code == 200:
                    got = np.array(r.json()["outputs"][0]["data"], np.float32)
                    if np.abs(got - expected.ravel()).max() > EXACT:
                        codes["wrong numbers"] += 1

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)
        victim = _replicas(cluster)[0]
        os.kill(victim.pid, signal.SIGKILL)
        time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert codes[200] > 0 and codes["wrong numbers"] == 0, codes
    # it answers again: 20 requests in a row, then two live replicas (one of them new)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if all(httpx.post(f"{url}/v2/models/{NAME}/infer", json=body,
                              timeout=30).status_code == 200 for _ in range(20)):
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        raise AssertionError(f"not answering after the kill ({dict(codes)})")
    while time.monotonic() < deadline:
        pids = {a.pid for a in _replicas(cluster)}
        if len(pids) == 2 and victim.pid not in pids:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("Ray Serve did not replace the killed replica")


# -- the config file, deployed by Ray's own `serve deploy` ----------------------------------
def test_the_written_config_deploys_with_serve_deploy(cluster, served, bundle, runtime,  # noqa: F811
                                                      tmp_path):
    written = tmp_path / "vit.serve.yaml"
    done = subprocess.run([BIN / "vit-deploy", "serve", str(bundle), "--write-config", written,
                           "--name", NAME, "--host", "127.0.0.1", "--port", str(served["port"]),
                           "--replicas", "1", "--cpus-per-replica", "0.5", "-q"],
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(written), done.stderr
    config = yaml.safe_load(written.read_text())
    assert config["applications"][0]["args"]["bundle"] == str(bundle.resolve())
    # the CLI's deployment goes when it is stopped (SIGTERM), leaving the route free
    served["proc"].send_signal(signal.SIGTERM)
    t0 = time.monotonic()  # its replicas wait 2 s for requests in flight, not Ray's 20
    assert served["proc"].wait(timeout=60) == 0, served["proc"].returncode
    assert time.monotonic() - t0 < 8, time.monotonic() - t0
    _gone(served["url"])
    dashboard = cluster["state"]
    subprocess.run([BIN / "serve", "deploy", written, "-a", dashboard], env=ENV, check=True,
                   capture_output=True, timeout=120)
    _wait_ready(served["url"])
    x = _pixels(1, seed=21)
    r = httpx.post(f"{served['url']}/v2/models/{NAME}/infer", timeout=30, json={
        "inputs": [{"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32",
                    "data": x.ravel().tolist()}]})
    got = np.array(r.json()["outputs"][0]["data"], np.float32)
    np.testing.assert_allclose(got, runtime.run_all(x)[LOGITS_NAME].ravel(), rtol=0, atol=EXACT)


def _gone(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/models/{NAME}/ready", timeout=5).status_code != 200:
                return
        except httpx.HTTPError:
            return
        time.sleep(0.5)
    raise AssertionError("the application was not removed when serve --ray stopped")


# -- embed: Ray Data, killed mid-job and resumed ---------------------------------------------
@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[list[Path], Path, list[Path]]:
    """30 photos-sized random images in a folder and a text list, and two bad ones."""
    root = tmp_path_factory.mktemp("embed-images")
    rng = np.random.default_rng(0)
    good = []
    for i in range(30):
        folder = root / ("a" if i < 20 else "b")
        folder.mkdir(exist_ok=True)
        good.append(folder / f"{i:02d}.png")
        Image.fromarray(rng.integers(0, 255, (240, 320, 3), np.uint8)).save(good[-1])
    bad = [root / "a" / "broken.jpg", root / "b" / "truncated.png"]
    bad[0].write_bytes(b"not an image")
    bad[1].write_bytes(good[0].read_bytes()[:200])
    listing = root / "list.txt"
    listing.write_text("# the b folder, listed\n" + "\n".join(
        os.path.relpath(p, root) for p in sorted((root / "b").iterdir())) + "\n")
    return good, listing, bad


def test_embed_killed_mid_job_resumes_to_the_runtimes_outputs(cluster, bundle, runtime,  # noqa: F811
                                                              images, tmp_path):
    good, listing, bad = images
    out = tmp_path / "features.parquet"
    args = ["embed", str(bundle), str(good[0].parent), str(listing), "--out", str(out),
            "--ray", cluster["address"], "--shard-size", "2", "--batch", "2", "--actors", "2"]
    proc = _start(args)
    try:
        for line in proc.stderr:  # progress lines (not a terminal: plain lines)
            if re.search(r"embedding: [1-9]\d*/16 shard", line):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    finished = sorted(parts_dir(out).glob("part-*.parquet"))
    assert not out.exists() and 1 <= len(finished) < 16, finished

    done = subprocess.run([BIN / "vit-deploy", *args], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = re.search(r"(\d+) shard\(s\) computed, (\d+) found done", done.stdout)
    assert resumed and int(resumed[2]) >= len(finished), done.stdout
    assert "2 image(s) could not be used" in done.stdout, done.stdout
    assert not parts_dir(out).exists()

    rows = pq.read_table(out).to_pylist()
    paths = [r["path"] for r in rows]
    assert paths == sorted(map(str, good + bad)) and len(set(paths)) == len(paths)
    pre = runtime.preprocess()
    for row in rows:
        if Path(row["path"]) in bad:
            assert row["error"] and row["pooled"] is None and row["logits"] is None
            continue
        assert row["error"] is None
        expected = runtime.run_all(pre(row["path"])[None])
        np.testing.assert_allclose(row["pooled"], expected[FEATURES_NAME][0], rtol=0, atol=EXACT)
        np.testing.assert_allclose(row["logits"], expected[LOGITS_NAME][0], rtol=0, atol=EXACT)
        top = runtime.predict(row["path"], top_k=5)[0].top
        assert row["top_k_index"] == [c.index for c in top]
        assert row["top_k_label"] == [c.label for c in top]


def test_embed_refuses_bad_input_with_one_line(bundle, tmp_path):  # noqa: F811
    done = subprocess.run([BIN / "vit-deploy", "embed", str(bundle), str(tmp_path),
                           "--out", str(tmp_path / "f.parquet")], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no images found" in done.stderr
    done = subprocess.run([BIN / "vit-deploy", "serve", str(bundle), "--ray", "nowhere"],
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--ray must be auto, local, HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr
    nobody = f"127.0.0.1:{_free_port()}"  # said at once, not after Ray's minutes of retries
    done = subprocess.run([BIN / "vit-deploy", "serve", str(bundle), "--ray", nobody], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == \
        f"Error: cannot reach the Ray cluster at {nobody!r}: Connection refused\n", done.stderr


def test_shards_are_named_by_the_job_and_their_paths(images, tmp_path):
    """What makes a rerun skip the right shards: the same job over the same images names the
    same shards; another model or top-k, or one image more, renames what it changes."""
    from vit_deploy.ray.shards import collect_paths, plan

    good, listing, bad = images
    paths = collect_paths([good[0].parent, listing, listing])  # a repeat counts once
    assert paths == sorted(map(str, good + bad))
    first = plan(paths, job="model-a", shard_size=5)
    assert [s.name for s in first] == [s.name for s in plan(paths[::-1], job="model-a",
                                                              shard_size=5)]
    assert [len(s.paths) for s in first] == [5] * 6 + [2]
    assert not {s.name for s in first} & {s.name for s in plan(paths, job="model-b",
                                                                shard_size=5)}
    more = plan(sorted(paths + ["/zz/last.png"]), job="model-a", shard_size=5)
    assert [s.name for s in more[:-1]] == [s.name for s in first[:-1]]
    missing = tmp_path / "list.txt"
    missing.write_text("nope.png\n")
    with pytest.raises(ValueError, match=r"line 1: 'nope.png' does not exist"):
        collect_paths([missing])
