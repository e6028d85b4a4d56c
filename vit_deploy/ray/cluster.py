"""Joining a Ray cluster from the command line: `auto` (the cluster running here, as
`ray start` left it), `local` (a cluster started in this process, gone when it ends) or an
address (HOST:PORT of a head node, or ray://HOST:PORT), quietly; and `serve_on_cluster`,
what `vit-deploy serve --ray` runs: deploy, say where, hold until stopped, undeploy."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from vit_deploy.progress import Progress, silent
from vit_deploy.ray.reaper import reaping
from vit_deploy.runtime.errors import FAILED, VitDeployError

# Ray reports usage statistics from a head node it starts unless this is "0"; for clusters
# `--ray local` starts we set it (a user's own setting, "1", is kept: the opt-in). A cluster
# we join (auto, an address) keeps its own setting (docs/guarantees.md).
RAY_USAGE_STATS = "RAY_USAGE_STATS_ENABLED"
# A cluster Ray starts in-process authenticates with a token (Ray 2.5x and later) and,
# when none is set, writes a new one to ~/.ray/auth_token, where every later `ray start`
# and `ray.init` on this machine finds it and fails against clusters without it. For
# `--ray local` we hand Ray a token of this process's own in the environment (its workers
# inherit it), unless the user chose a mode or a token.
RAY_AUTH = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
# "0": the cluster is this machine's alone, its node address loopback (Ray's own switch for
# Windows and macOS, read on Linux too: ray_constants.ENABLE_RAY_CLUSTER)
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def check_address(address: str) -> str:
    """`auto`, `local`, HOST:PORT or ray://HOST:PORT; ValueError naming what was given."""
    text = address.strip()
    if text in ("auto", "local"):
        return text
    host, _, port = text.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--ray must be auto, local, HOST:PORT or ray://HOST:PORT, got "
                         f"{address!r}")
    return text


QUIET_LOGGERS = ("ray", "ray.serve", "ray.data")  # what -q silences below ERROR


@contextlib.contextmanager
def connected(address: str, *, quiet: bool = False) -> Iterator[None]:
    """ray.init on `address` (check_address), its logs kept out of stdout; shut down after.
    `quiet` (the commands' -q): Ray's and Ray Serve's own lines below errors are dropped too
    (the token notice, "Started Serve", "Application ... is ready")."""
    address = check_address(address)
    if address not in ("auto", "local"):
        reachable(address)
    # a cluster we start: on loopback, no dashboard (which asks the cloud metadata address)
    local = {"include_dashboard": False, "_node_ip_address": "127.0.0.1"} \
        if address == "local" else {}
    if address == "local":  # a cluster we start: Ray's usage reporting off unless asked for
        os.environ.setdefault(RAY_USAGE_STATS, "0")
        # Ray finds "this node's address" by a UDP connect to 8.8.8.8:53 unless told that the
        # cluster is one machine's: then loopback (inherited by its workers)
        quiet = True  # its Python loggers' notices (the token one) are Ray's: errors only
        if os.environ.setdefault(LOCAL_ONLY, "0") == "0":  # read at import: this process too
            from ray._private import ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False
        if not any(os.environ.get(name) for name in RAY_AUTH):  # nothing into ~/.ray
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # Ray turns token mode on
    reaper = reaping() if address == "local" else contextlib.nullcontext()
    with reaper:  # a SIGKILL of this command leaves nothing of a cluster it started
        yield from _joined(address, quiet, local)


def _joined(address: str, quiet: bool, local: dict[str, Any]) -> Iterator[None]:
    try:
        ray.init(address=address, logging_level=logging.ERROR if quiet else logging.WARNING,
                 log_to_driver=False, **local)
    except ConnectionError as e:
        raise ConnectionError(f"cannot join the Ray cluster at {address!r}: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if quiet:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        ray.shutdown()


# How long a job waits for the CPUs it needs to come free (a dead driver's actors, another
# application's replicas) before it says what holds them and stops.
SCHEDULE_DEADLINE_S = 60.0


RESERVED_FOR = "read images"  # what wait_for_cpus' reserve is for (embed's reading tasks)


class ClusterBusy(VitDeployError):
    """The cluster cannot give a job the CPUs it needs (now, or ever): says what holds them."""

    exit_code = FAILED


def _node_cpus() -> list[float]:
    return [float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]


def holders(limit: int = 6) -> str:
    """The live actors on the cluster by class, the most first: what holds its CPUs."""
    try:
        from ray.util.state import list_actors

        alive = list_actors(filters=[("state", "=", "ALIVE")], limit=1000, raise_on_missing_output=False)
    except Exception as e:  # the state API is the dashboard's: not every cluster has it
        return f"unknown (Ray's state API: {str(e).splitlines()[0][:100] if str(e) else type(e).__name__})"
    count: dict[str, int] = {}
    for actor in alive:
        name = getattr(actor, "class_name", None) or "actor"
        count[name] = count.get(name, 0) + 1
    if not count:
        return "no live actors (tasks, or placement groups)"
    ranked = sorted(count.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{n} x {name}" for name, n in ranked[:limit]) + (
        f" and {len(ranked) - limit} more kinds" if len(ranked) > limit else "")


def require_capacity(each: float, count: int, *, what: str, every: bool = False) -> float:
    """The cluster's CPUs in all; ClusterBusy where it can never hold one unit of `each` CPUs
    (no node that large) or, with `every`, all `count` of them: Ray would wait forever."""
    nodes = _node_cpus()
    largest, total = max(nodes, default=0.0), sum(nodes)
    if each > largest + 1e-9:
        raise ClusterBusy(f"{what}: {each:g} CPUs each, but the largest node of the cluster has "
                          f"{largest:g} ({len(nodes)} node(s), {total:g} CPUs in all)")
    if every and each * count > total + 1e-9:
        raise ClusterBusy(f"{what}: {count} x {each:g} = {each * count:g} CPUs, but the cluster "
                          f"has {total:g} ({len(nodes)} node(s))")
    return total


def wait_for_cpus(each: float, count: int, *, what: str, every: bool = False,
                  reserve: float = 0.0, deadline_s: float = SCHEDULE_DEADLINE_S,
                  progress: Progress = silent) -> int:
    """How many of `count` units of `each` CPUs (actors, replicas) can start now: at least
    one, or all of them with `every` (Serve waits for every replica), with `reserve` CPUs
    left free beside them (embed's image-reading tasks: an actor pool that takes the last
    CPU starves them, and Ray Data waits forever). ClusterBusy at once where the cluster can
    never hold them (no node has `each` CPUs; with `every`, fewer CPUs in all than count x
    each); after `deadline_s` if they do not come free, naming what holds them. Progress
    says it waits."""
    total = require_capacity(each, count, what=what, every=every)
    need = (each * count if every else each) + reserve
    start, said = time.monotonic(), False
    while True:
        free = float(ray.available_resources().get("CPU", 0.0))
        if free + 1e-9 >= need:
            return count if every else max(1, min(count, int((free - reserve + 1e-9) // each)))
        waited = time.monotonic() - start
        for_what = f" ({reserve:g} of them to {RESERVED_FOR})" if reserve else ""
        if waited >= deadline_s:
            raise ClusterBusy(f"{what}: {need:g} CPUs needed{for_what}, {free:g} of {total:g} "
                              f"free after {waited:.0f} s; held by: {holders()}")
        if not said:
            progress(f"waiting for {need:g} free CPUs{for_what} ({free:g} of {total:g} free; "
                     f"at most {deadline_s:.0f} s)")
            said = True
        time.sleep(min(1.0, max(0.05, deadline_s - waited)))


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """ConnectionError unless HOST:PORT accepts a TCP connection (ray.init would retry an
    unreachable head for minutes before saying so)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"cannot reach the Ray cluster at {address!r}: "
                              f"{e.strerror or e}") from None


def free_port(host: str) -> int:
    """A port free on `host` now (Ray Serve's proxy takes a fixed port, not 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM ends the wait as Ctrl-C does, so the application is undeployed on the way
    out (a plain SIGTERM would leave it running on the cluster)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _proxy_address(host: str, port: int) -> tuple[str, int]:
    """Where Ray Serve's HTTP proxies really listen: where asked, unless Serve already ran
    on the cluster with other HTTP options (then it keeps its own, and so do we, saying so)."""
    from ray.serve.context import _get_global_client

    try:
        config = _get_global_client().http_config
        actual = (config.host, int(config.port))
    except Exception:  # a Ray without this (private) attribute: trust what was asked
        return host, port
    if actual != (host, port):
        warnings.warn(f"Ray Serve already runs on this cluster, listening on "
                      f"{actual[0]}:{actual[1]}; --host {host} --port {port} are not applied "
                      f"(`serve shutdown` first to change them)", RuntimeWarning, stacklevel=2)
    return ("127.0.0.1" if actual[0] == "0.0.0.0" and host != "0.0.0.0" else actual[0],
            actual[1])


def serve_on_cluster(bundle: Path, options: Any, *, address: str, host: str, port: int,
                     on_ready: Callable[[str], None], quiet: bool = False) -> None:
    """Deploy the bundle (`serve_app.app`) as the application named after its model on the
    cluster at `address`, Ray Serve's HTTP proxy on host:port (0: a free one), route
    prefix /; call on_ready(url) once it serves; hold until Ctrl-C or SIGTERM, then
    delete the application (a `local` cluster goes with the process)."""
    from ray import serve

    from vit_deploy.ray.serve_app import app, resolved

    path, options = resolved(bundle, options)  # a bad bundle: refused before joining
    port = port or free_port(host)
    with connected(address, quiet=quiet), _sigterm_stops():  # after ray.init: it installs its own
        try:
            require_capacity(options.cpus_per_replica, options.replicas, every=True,
                             what="serve --ray (--replicas x --cpus-per-replica)")
            serve.start(http_options={"host": host, "port": port})
            host, port = _proxy_address(host, port)
            serve.run(app(path, options), name=options.model_name, route_prefix="/",
                      blocking=False)
        except (ray.exceptions.RayError, TimeoutError) as e:  # e.g. the proxy not up in 60 s
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ConnectionError(f"Ray Serve did not start on the cluster at {address!r}: "
                                  f"{why[:300]}") from None
        on_ready(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            if check_address(address) != "local":  # a local cluster goes with ray.shutdown
                with contextlib.suppress(Exception):  # the cluster may be gone already
                    serve.delete(options.model_name)
