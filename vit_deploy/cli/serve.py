"""`vit-deploy serve`: a bundle over HTTP (FastAPI, imported only when it runs)."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import (MAX_BATCH, InputPath, console, precision_option,
                                    provider_option, quiet_option)


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
@click.option("--name", default=None, help="Model name on the v2 endpoints (default: the "
              "bundle name, as `vit-deploy triton` names it).")
@quiet_option("only the URL served, once it listens")
def serve(bundle: Path, host: str, port: int, provider: str, precision: str, max_batch: int,
          max_wait_ms: float, top_k: int, name: str | None, quiet: bool) -> None:
    """Serve BUNDLE over HTTP: POST /predict, the Open Inference Protocol (KServe v2:
    /v2/models/NAME/infer, ...), GET /health, /metadata, /stats, /metrics (Prometheus).

    \b
    Example:
      vit-deploy serve vit-B16-224 --port 8000 --provider cuda,cpu --precision int8
    """
    from vit_deploy.runtime import ViTSession
    from vit_deploy.triton import model_name

    try:
        from vit_deploy.serve.app import make_app
        from vit_deploy.serve.run import serve as run_server
    except ImportError:
        raise click.UsageError("serve needs FastAPI, uvicorn and prometheus-client: "
                               "pip install 'vit-deploy[serve]'") from None
    name = model_name(name, bundle)
    session = ViTSession(bundle, provider=provider, precision=precision)
    app = make_app(session, max_batch=max_batch, max_wait_ms=max_wait_ms, top_k=top_k,
                   model_name=name)

    def ready(url: str) -> None:
        if quiet:
            click.echo(url)
        else:
            console().print(f"serving {bundle} as model {name!r} ({precision}, "
                            f"{session.providers[0]}) on {url}")

    run_server(app, host, port, on_ready=ready)
