"""Ray Serve: replicas of the torch-free runtime behind the HTTP surface of `vit-deploy
serve`, unchanged (POST /predict, the Open Inference Protocol under /v2, /health, /metadata,
/stats, /metrics, the same model name, tensors and `{"error": ...}` answers).

Each replica builds the app `serve.app.make_app` builds and is its FastAPI ingress
(`@serve.ingress`, bound late: `__serve_build_asgi_app__` returns the app once the session
is open). Only the batch worker differs: `RayBatcher` hands every request to a method
decorated with Ray Serve's `@serve.batch` (counted in images, as `Batcher` counts them), and
the batch it gets runs through `Batcher._predict`: the same grouping by size, the same
per-request failures.

    app(bundle, options)        the Application (serve.run it, or `vit-deploy serve --ray`)
    build(args)                 the same from a dict: the import_path of a config file
    write_config(bundle, ...)   a `serve deploy` config file, written atomically
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ray import serve

from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.providers import parse_providers
from vit_deploy.runtime.ort_session import RuntimeOptions
from vit_deploy.serve.app import make_app
from vit_deploy.serve.batcher import QUEUE_BATCHES, Batcher, Job
from vit_deploy.serve.errors import Failure, busy, describe
from vit_deploy.serve.limits import Limits
from vit_deploy.serve.metrics import collector_registry
from vit_deploy.serve.pace import BodyPace
from vit_deploy.triton import model_name as checked_model_name

DEPLOYMENT = "ViTReplica"  # the deployment's name in Ray Serve (status, logs, config files)
BUILDER = "vit_deploy.ray.serve_app:build"  # the import_path config files name
# A replica takes as many requests at once as its batch queue holds (serve's QUEUE_BATCHES
# full batches): a request whose body is still arriving holds one of them, so with few (4
# batches' worth) 40 stalled clients kept a valid request waiting for the body deadline.
# Their bodies are bounded in bytes by the app's own BodyBudget (`max_body_bytes`, 503 past
# it, as in `serve`), the work in flight by the queue (503).
ONGOING_BATCHES = QUEUE_BATCHES
# How long a replica being stopped waits for its requests in flight (Ray's default is 20 s:
# `serve --ray` took that long to exit on SIGTERM)
SHUTDOWN_S = 2.0


@dataclass(frozen=True, kw_only=True)
class RayServeOptions:
    """What a Ray Serve deployment of a bundle is: the session (provider, precision), the
    batching (as `vit-deploy serve`), the model name on the v2 endpoints (default: the
    bundle directory's name), and the replicas and CPUs each one reserves (its ONNX Runtime
    threads: that many, at least one)."""

    provider: str = "cpu"
    precision: str = "fp32"
    max_batch: int = 8
    max_wait_ms: float = 5.0
    top_k: int = 5
    model_name: str | None = None
    replicas: int = 1
    cpus_per_replica: float = 1.0
    max_side: int | None = None  # a v2 request's longest side (None: the bundle's largest checked)

    def __post_init__(self) -> None:
        checks = {"max_batch": self.max_batch >= 1, "top_k": self.top_k >= 1,
                  "replicas": self.replicas >= 1, "max_wait_ms": self.max_wait_ms >= 0,
                  "cpus_per_replica": self.cpus_per_replica > 0,
                  "max_side": self.max_side is None or self.max_side >= 1}
        bad = [f"{k}={getattr(self, k)!r}" for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"Ray Serve options out of range: {', '.join(bad)} (expected "
                             f"max_batch, top_k, replicas, max_side >= 1, max_wait_ms >= 0, "
                             f"cpus_per_replica > 0)")

    @classmethod
    def from_dict(cls, args: dict[str, Any]) -> RayServeOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown Ray Serve option(s) {unknown}; known: {sorted(known)}")
        return cls(**args)


def _rows(jobs: list[Job]) -> int:
    """A batch's size for @serve.batch: its images (a v2 request may hold several)."""
    return sum(job.rows for job in jobs)


class RayBatcher(Batcher):
    """A Batcher whose batches Ray Serve forms (@serve.batch, max_batch images, waiting
    max_wait_ms for more) and whose results `Batcher._predict` computes. At most
    `max_queue` requests are in flight in a replica (more: 503 with Retry-After); Ray's
    own `max_ongoing_requests` holds the rest at the proxy."""

    def __init__(self, session: Any, **kw: Any):
        super().__init__(session, **kw)
        self._running = False
        self._reason: str | None = "the batch worker has not started"
        self._in_flight: set[asyncio.Task] = set()
        self._batched.set_max_batch_size(self.max_batch)
        self._batched.set_batch_wait_timeout_s(self.max_wait)

    def start(self) -> None:  # type: ignore[override]  # the lifespan ignores what it returns
        self._running, self._reason = True, None

    async def stop(self) -> None:
        self._running, self._reason = False, "the replica is shutting down"
        for task in list(self._in_flight):
            task.cancel()

    def stopped(self) -> str | None:
        return self._reason

    def queue_depth(self) -> int:
        return len(self._in_flight)

    def _enqueue(self, job: Job) -> asyncio.Future:
        if self._reason:
            raise Failure(503, f"not serving: {self._reason}")
        if len(self._in_flight) >= self.max_queue:
            raise busy(f"{self.max_queue} requests are already in this replica (the limit)")
        task = asyncio.ensure_future(self._answer_one(job))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return job.future

    async def _answer_one(self, job: Job) -> None:
        try:
            result = await self._batched(job)
        except asyncio.CancelledError:
            result = Failure(503, "the server is shutting down")
        except Exception as e:  # @serve.batch raised for the whole batch: a bug below
            self.metrics.count("worker_errors")
            result = Failure(500, f"the batch failed: {describe(e)}")
        if not job.future.done():
            job.future.set_result(result)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005, batch_size_fn=_rows)
    async def _batched(self, jobs: list[Job]) -> list[Any]:
        """One result per job (a dict or a Failure); jobs whose client left get None."""
        live = [job for job in jobs if not job.future.done()]
        results: dict[int, Any] = {}
        if live:
            loop = asyncio.get_running_loop()
            for job, result in zip(live, await loop.run_in_executor(None, self._predict, live)):
                results[id(job)] = result
        return [results.get(id(job)) for job in jobs]


def replica_app(session: Any, options: RayServeOptions) -> Any:
    """The FastAPI app a replica serves: `make_app`'s, with a RayBatcher as its batch worker
    (and its metrics registry over that batcher), reading bodies within `BodyPace`."""
    limits = Limits(max_side=options.max_side)
    app = make_app(session, max_batch=options.max_batch, max_wait_ms=options.max_wait_ms,
                   top_k=options.top_k, model_name=options.model_name, limits=limits)
    batcher = RayBatcher(session, max_batch=options.max_batch, max_wait_ms=options.max_wait_ms,
                         top_k=options.top_k)
    app.state.batcher = batcher
    app.state.registry = collector_registry(batcher)
    # the proxy streams a body in while the request holds a replica slot: `serve`'s body
    # timeout and minimum rate, here (slow clients held every slot, /health too)
    app.add_middleware(BodyPace, limits=limits)
    return app


@serve.deployment(name=DEPLOYMENT)
@serve.ingress()
class ViTReplica:
    """One replica: a ViTSession of the bundle, served by `replica_app`."""

    def __init__(self, bundle: str, options: dict[str, Any]):
        self.options = RayServeOptions.from_dict(options)
        threads = max(1, int(self.options.cpus_per_replica))
        self.session = ViTSession(bundle, provider=self.options.provider,
                                  precision=self.options.precision,
                                  options=RuntimeOptions(threads=threads,  # batches of
                                                         static_shapes=False))  # any size

    def __serve_build_asgi_app__(self) -> Any:
        return replica_app(self.session, self.options)


def resolved(bundle: str | Path, options: RayServeOptions) -> tuple[Path, RayServeOptions]:
    """The bundle as an absolute path (replicas on other nodes open it there: a shared
    file system) and the options with the model name filled in. The manifest is read
    here, so a bad bundle is refused before anything is deployed."""
    path = Path(bundle).resolve()
    if not path.is_dir():
        raise ValueError(f"Ray Serve needs a bundle directory (its manifest says how to "
                         f"preprocess), got {str(bundle)!r}")
    manifest = load_manifest(path)
    manifest.require_nchw("Ray Serve (serve --ray, --write-config)")  # NaFlex: named here
    manifest.model_path(path, options.precision)  # a precision the bundle lacks: refused
    parse_providers(options.provider)  # an unknown provider name: refused, not deployed
    return path, replace(options, model_name=checked_model_name(options.model_name, path))


def app(bundle: str | Path, options: RayServeOptions = RayServeOptions()) -> Any:
    """The Ray Serve Application of `bundle`: `options.replicas` replicas, each reserving
    `options.cpus_per_replica` CPUs. Run it with `serve.run(app(...), route_prefix="/")`."""
    path, options = resolved(bundle, options)
    deployment = ViTReplica.options(
        num_replicas=options.replicas,
        ray_actor_options={"num_cpus": options.cpus_per_replica},
        max_ongoing_requests=ONGOING_BATCHES * options.max_batch,
        graceful_shutdown_timeout_s=SHUTDOWN_S, graceful_shutdown_wait_loop_s=0.5)
    return deployment.bind(str(path), asdict(options))


def build(args: dict[str, Any]) -> Any:
    """The application builder a config file names (`import_path`): its `args` are
    `bundle` and the fields of RayServeOptions."""
    args = dict(args)
    bundle = args.pop("bundle", None)
    if not bundle:
        raise ValueError("the config's args must name the bundle directory: bundle: PATH")
    return app(bundle, RayServeOptions.from_dict(args))


def config_path(bundle: str | Path) -> Path:
    """Where --write-config writes by default: beside the bundle, BUNDLE.serve.yaml."""
    path = Path(bundle).resolve()
    return path.with_name(f"{path.name}.serve.yaml")


def write_config(bundle: str | Path, options: RayServeOptions = RayServeOptions(), *,
                 path: str | Path | None = None, host: str = "0.0.0.0",
                 port: int = 8000) -> Path:
    """A Ray Serve config file for `serve deploy FILE` (a running cluster), checked against
    Ray's own schema and written atomically to `path` (default: `config_path(bundle)`)."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from vit_deploy.runtime.files import write_bytes_atomic

    bundle_path, options = resolved(bundle, options)
    config = {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": [{
            "name": options.model_name, "route_prefix": "/", "import_path": BUILDER,
            "args": {"bundle": str(bundle_path), **asdict(options)},
        }],
    }
    ServeDeploySchema.model_validate(config)  # what `serve deploy` will check
    header = (f"# Ray Serve config for {bundle_path.name}, written by `vit-deploy serve "
              f"--write-config`.\n# Deploy it to a running cluster: serve deploy FILE "
              f"(the bundle path must exist on every node).\n")
    out = Path(path) if path is not None else config_path(bundle_path)
    return write_bytes_atomic(out, (header + yaml.safe_dump(config, sort_keys=False)).encode())
