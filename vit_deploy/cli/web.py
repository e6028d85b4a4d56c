"""`vit-deploy web`: a static site that runs a bundle in the browser."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from vit_deploy.cli.options import FORCE_INTO_OUT, MAX_THREADS, console, force_option, quiet_option
from vit_deploy.cli.params import InputPath, PrecisionList


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@click.option("--out", type=click.Path(path_type=Path), required=True, metavar="DIR",
              help="Site directory to write.")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True, help="Models the site carries, comma-separated, e.g. "
              "int8,fp32 (the first is the page's default).")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
              help="WebAssembly threads (default: onnxruntime-web's, min(4, cores / 2)); more "
                   "than one needs a cross-origin isolated page (COOP/COEP headers).")
@force_option(FORCE_INTO_OUT)
@click.option("--serve", "serve_it", is_flag=True, help="Then serve the site locally with the "
              "COOP/COEP headers and MIME types it needs, until Ctrl-C.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="With --serve: interface to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="With --serve: port (0: any free one).")
@click.option("--no-isolation", is_flag=True, help="With --serve: send no COOP/COEP headers "
              "(to see the one-thread fallback a plain host gives).")
@quiet_option("only the site directory written, then with --serve the URL served")
def web(bundle: Path, out: Path, precisions: tuple[str, ...], threads: int | None, force: bool,
        serve_it: bool, host: str, port: int, no_isolation: bool, quiet: bool) -> None:
    """Write a static site that runs BUNDLE in the browser (onnxruntime-web: WebGPU when
    the browser offers it, else WebAssembly): a demo page, vit-deploy.mjs, the model(s).

    \b
    Example:
      vit-deploy web vit-B16-224 --out site --precision int8,fp32 --serve
    """
    from vit_deploy.website.site import serve_site, write_site

    result = write_site(bundle, out, precisions=precisions, threads=threads, force=force)
    screen = console()
    if quiet:
        click.echo(str(out))
    else:
        screen.print(result)
    if serve_it:
        def ready(url: str) -> None:
            if quiet:
                click.echo(url)
            else:
                screen.print(f"serving {out} on {url}" + (" (no COOP/COEP: one thread)"
                                                          if no_isolation else ""))
            sys.stdout.flush()
        serve_site(out, host, port, isolation=not no_isolation, on_ready=ready)
