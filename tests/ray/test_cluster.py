"""A Ray job that cannot get its CPUs says so, never waits silently: `require_capacity`
refuses what no node or no cluster of that size can hold, `wait_for_cpus` waits at most
its deadline, then names what holds the CPUs (ray/cluster.py). The cluster is faked for
the logic (its nodes and free CPUs varied); one real local cluster for the command."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from vit_deploy.ray import cluster

ROOT = Path(__file__).resolve().parents[2]
PHOTO = ROOT / "vit_deploy" / "data" / "photos" / "eval-chelsea.jpg"


@pytest.fixture
def fake(monkeypatch):
    """A cluster of nodes (CPUs each) whose free CPUs follow a script, one value per poll."""
    state = {"nodes": [2.0, 2.0], "free": [4.0], "polls": 0}

    def available():
        state["polls"] += 1
        free = state["free"]
        return {"CPU": free[min(state["polls"] - 1, len(free) - 1)]}

    monkeypatch.setattr(cluster.ray, "nodes", lambda: [
        {"Alive": True, "Resources": {"CPU": c}} for c in state["nodes"]] + [
        {"Alive": False, "Resources": {"CPU": 64.0}}])  # a dead node counts for nothing
    monkeypatch.setattr(cluster.ray, "available_resources", available)
    monkeypatch.setattr(cluster, "holders", lambda limit=6: "3 x ServeReplica:vit:ViT")
    return state


@pytest.mark.parametrize("nodes, each, count, every, fits", [
    ([2, 2], 2, 1, False, True), ([2, 2], 2.5, 1, False, False),  # one node must hold it
    ([2, 2], 1, 4, True, True), ([2, 2], 1, 5, True, False),  # Serve: every replica at once
    ([2, 2], 1, 50, False, True),  # an actor pool grows as CPUs come free: one is enough
    ([0.5], 0.5, 1, False, True), ([0.5], 0.51, 1, False, False), ([], 0.1, 1, False, False)])
def test_what_the_cluster_can_never_hold_is_refused_at_once(fake, nodes, each, count, every,
                                                             fits):
    fake["nodes"] = [float(n) for n in nodes]
    if fits:
        assert cluster.require_capacity(each, count, what="job", every=every) == sum(nodes)
        return
    with pytest.raises(cluster.ClusterBusy) as e:
        cluster.require_capacity(each, count, what="job", every=every)
    assert str(e.value).startswith("job: ") and f"{sum(nodes):g}" in str(e.value), e.value
    assert fake["polls"] == 0  # nothing waited for


@pytest.mark.parametrize("free, each, count, every, expected", [
    ([4.0], 1.0, 8, False, 4), ([1.5], 1.0, 8, False, 1), ([4.0], 0.5, 3, False, 3),
    ([4.0], 1.0, 4, True, 4), ([0.0, 0.0, 2.0], 1.0, 8, False, 2),  # freed while waiting
    ([1.0, 3.0], 1.0, 3, True, 3)])
def test_it_starts_what_fits_now_or_once_freed(fake, free, each, count, every, expected):
    fake["free"] = free
    said = []
    got = cluster.wait_for_cpus(each, count, what="job", every=every, deadline_s=30,
                                progress=said.append)
    assert got == expected
    assert bool(said) == (fake["polls"] > 1)  # it says it waits, only when it does
    assert all("waiting for" in line for line in said), said


def test_past_the_deadline_it_names_what_holds_the_cpus(fake):
    fake["free"] = [0.5]
    said = []
    start = time.monotonic()
    with pytest.raises(cluster.ClusterBusy) as e:
        cluster.wait_for_cpus(1.0, 2, what="embed's actors", deadline_s=0.3, progress=said.append)
    assert time.monotonic() - start < 5
    text = str(e.value)
    assert "embed's actors" in text and "0.5 of 4 free" in text and "ServeReplica" in text, text
    assert e.value.exit_code == 1 and len(said) == 1


@pytest.mark.parametrize("free, expected", [([1.5], 1), ([2.5], 2), ([4.0], 3)])
def test_a_reserve_stays_free_beside_the_pool(fake, free, expected):
    """embed's pool leaves a reading task's CPUs free: 1.5 free holds one 1-CPU actor and
    the 0.5 a reader needs, not a second actor."""
    fake["free"] = free
    assert cluster.wait_for_cpus(1.0, 3, what="job", reserve=0.5, deadline_s=30) == expected


def test_one_free_cpu_is_not_enough_for_an_actor_and_its_reader(fake):
    """The two-node resume that hung (1 CPU a node, a killed run's worker holding one): the
    actor alone would fit and take the last CPU, the readers would never run and Ray Data
    would wait forever. Now it waits its deadline, saying for what, then stops naming it."""
    fake["free"] = [1.0]
    said = []
    with pytest.raises(cluster.ClusterBusy) as e:
        cluster.wait_for_cpus(1.0, 1, what="embed's actors", reserve=0.5, deadline_s=0.3,
                              progress=said.append)
    text = str(e.value)
    assert "1.5 CPUs needed (0.5 of them to read images), 1 of 4 free" in text, text
    assert len(said) == 1 and "0.5 of them to read images" in said[0], said


@pytest.mark.heavy
def test_embed_asking_more_cpus_than_any_node_has_says_so(tmp_path, make_tiny):
    """On a real cluster `--ray local` starts (this machine's CPUs): exit 1 at once, one
    line, no traceback (it waited forever before)."""
    from vit_deploy.export.bundle import ExportOptions, export_bundle

    bundle = tmp_path / "b"
    export_bundle(make_tiny(), bundle, options=ExportOptions(resolution=(32, 32), simplify=False))
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "vit_deploy.cli", "embed", str(bundle), str(PHOTO),
                        "--out", str(tmp_path / "f.parquet"), "--cpus-per-actor", "512",
                        "--ray", "local", "--quiet"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "--cpus-per-actor 512" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "f.parquet").exists() and time.monotonic() - start < 120
