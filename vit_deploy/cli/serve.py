"""`vit-deploy serve`: a bundle over HTTP (FastAPI, imported only when it runs)."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import MAX_BATCH, console


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--provider", default="cpu", show_default=True)
@click.option("--precision", default="fp32", show_default=True)
@click.option("--max-batch", type=click.IntRange(1, MAX_BATCH), default=8, show_default=True)
@click.option("--max-wait-ms", type=click.FloatRange(0, 60_000), default=5.0, show_default=True)
@click.option("--top-k", type=click.IntRange(1, 1_000_000), default=5, show_default=True)
@click.option("--name", default=None, help="Model name on the v2 endpoints (default: the "
              "bundle name, as `vit-deploy triton` names it).")
def serve(bundle: Path, host: str, port: int, provider: str, precision: str, max_batch: int,
          max_wait_ms: float, top_k: int, name: str | None) -> None:
    """Serve BUNDLE over HTTP: POST /predict, the Open Inference Protocol (KServe v2:
    /v2/models/NAME/infer, ...), GET /health, /metadata, /stats, /metrics (Prometheus)."""
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
    run_server(app, host, port, on_ready=lambda url: console().print(
        f"serving {bundle} as model {name!r} ({precision}, {session.providers[0]}) on {url}"))
