"""`vit-deploy serve`: a bundle over HTTP (FastAPI, imported only when it runs); with
--ray, the same HTTP surface from replicas on a Ray cluster (Ray Serve); with
--write-config, a `serve deploy` config file for one."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import console, precision_option, provider_option, quiet_option, refuse_clobber
from vit_deploy.cli.params import MAX_BATCH, InputPath

RAY_EXTRA = "pip install 'vit-deploy[ray]'"


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port (0: any free one).")
@provider_option(measured=False)
@precision_option("The bundle's model to serve.")
@click.option("--max-batch", type=click.IntRange(1, MAX_BATCH), default=8, show_default=True,
              help="Images run in one batch at most (requests are batched together).")
@click.option("--max-wait-ms", type=click.FloatRange(0, 60_000), default=5.0, show_default=True,
              help="How long a request waits for others to join its batch, in milliseconds.")
@click.option("--top-k", type=click.IntRange(1, 1_000_000), default=5, show_default=True,
              help="Classes returned per image by POST /predict.")
@click.option("--max-size", "max_side", type=click.IntRange(1, 16384), default=None,
              metavar="N", help="The longest image side a v2 request may send (413 above; "
              "default: the bundle's largest checked size).")
@click.option("--name", default=None, help="Model name on the v2 endpoints (default: the "
              "bundle name, as `vit-deploy triton` names it).")
@click.option("--ray", "ray_address", default=None, metavar="auto|local|HOST:PORT",
              help="Serve from Ray Serve replicas on a Ray cluster: auto (the one `ray "
                   "start` runs here), local (one started in this process) or a head "
                   "node's address. The same endpoints; the bundle path must exist on "
                   "every node. Needs the ray extra.")
@click.option("--replicas", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="With --ray or --write-config: replicas of the model (1 to 1024).")
@click.option("--cpus-per-replica", type=click.FloatRange(0.01, 1024), default=1.0,
              show_default=True, help="With --ray or --write-config: CPUs each replica "
              "reserves (0.01 to 1024; its ONNX Runtime threads: as many, at least one).")
@click.option("--write-config", "write_config", is_flag=False, flag_value="-", default=None,
              type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              metavar="[FILE]", help="Write a Ray Serve config file for `serve deploy` "
              "(a running cluster) and exit, serving nothing: --write-config alone writes "
              "BUNDLE.serve.yaml beside the bundle; --write-config FILE writes FILE.")
@quiet_option("only the URL served, once it listens (--write-config: the file written)")
def serve(bundle: Path, host: str, port: int, provider: str, precision: str, max_batch: int,
          max_wait_ms: float, top_k: int, max_side: int | None, name: str | None,
          ray_address: str | None,
          replicas: int, cpus_per_replica: float, write_config: Path | None,
          quiet: bool) -> None:
    """Serve BUNDLE over HTTP: POST /predict, the Open Inference Protocol (KServe v2:
    /v2/models/NAME/infer, ...), GET /health, /metadata, /stats, /metrics (Prometheus).
    With --ray, from Ray Serve replicas on a Ray cluster.

    \b
    Example:
      vit-deploy serve vit-B16-224 --port 8000 --provider cuda,cpu --precision int8
    """
    from vit_deploy.runtime import RuntimeOptions, ViTSession
    from vit_deploy.triton import model_name

    if not (ray_address or write_config) and (replicas != 1 or cpus_per_replica != 1.0):
        raise click.UsageError("--replicas and --cpus-per-replica are Ray Serve's: give "
                               "--ray ADDRESS or --write-config")
    name = model_name(name, bundle)

    def ready(url: str) -> None:
        if quiet:
            click.echo(url)
        else:
            where = f" on the Ray cluster {ray_address!r} ({replicas} replica(s))" \
                if ray_address else f" ({session.providers[0]})"
            console().print(f"serving {bundle} as model {name!r} ({precision}){where} "
                            f"on {url}")

    if ray_address or write_config:
        _serve_with_ray(bundle, ray_address, write_config, host, port, quiet, ready,
                        provider=provider, precision=precision, max_batch=max_batch,
                        max_wait_ms=max_wait_ms, top_k=top_k, model_name=name,
                        replicas=replicas, cpus_per_replica=cpus_per_replica,
                        max_side=max_side)
        return
    try:
        from vit_deploy.serve.app import make_app
        from vit_deploy.serve.limits import Limits
        from vit_deploy.serve.run import serve as run_server
    except ImportError:
        raise click.UsageError("serve needs FastAPI, uvicorn and prometheus-client: "
                               "pip install 'vit-deploy[serve]'") from None
    # the batcher forms every batch size up to --max-batch: OpenVINO keeps one dynamic model
    # rather than one compiled per shape (runtime/ov_session.py)
    session = ViTSession(bundle, provider=provider, precision=precision,
                         options=RuntimeOptions(static_shapes=False))
    app = make_app(session, max_batch=max_batch, max_wait_ms=max_wait_ms, top_k=top_k,
                   model_name=name, limits=Limits(max_side=max_side))
    run_server(app, host, port, on_ready=ready)


def _refuse_a_file_we_did_not_write(path: Path) -> None:
    """--write-config replaces only a config it wrote before (its first line says so)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise click.BadParameter(f"{str(path)!r} is not a regular file", param_hint="--write-config")
    if path.is_file():
        with open(path, "rb") as f:
            first = f.read(64)
        if not first.startswith(b"# Ray Serve config for "):
            raise click.BadParameter(f"{str(path)!r} exists and was not written by vit-deploy "
                                     f"serve --write-config; name another file",
                                     param_hint="--write-config")


def _serve_with_ray(bundle: Path, address: str | None, config: Path | None, host: str,
                    port: int, quiet: bool, ready, **options) -> None:
    try:
        from vit_deploy.ray.cluster import check_address, serve_on_cluster
        from vit_deploy.ray.serve_app import RayServeOptions, config_path, write_config
    except ImportError as e:
        raise click.UsageError(f"serve --ray needs Ray Serve ({e.name or e} is missing): "
                               f"{RAY_EXTRA}") from None
    ray_options = RayServeOptions(**options)
    if config is not None:
        if address is not None:
            raise click.UsageError("--write-config writes a file and serves nothing: drop "
                                   "--ray (deploy the file with `serve deploy FILE`)")
        target = None if str(config) == "-" else Path(config)
        refuse_clobber({"--write-config": target}, bundles=[bundle])
        _refuse_a_file_we_did_not_write(target if target is not None
                                        else config_path(bundle.resolve()))
        written = write_config(bundle, ray_options, path=target,
                               host=host, port=port)
        if quiet:
            click.echo(written)
        else:
            console().print(f"wrote {written}; deploy it to a running Ray cluster with: "
                            f"serve deploy {written}")
        return
    try:
        address = check_address(address or "")
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--ray") from None
    serve_on_cluster(bundle, ray_options, address=address, host=host, port=port,
                     on_ready=ready, quiet=quiet)
