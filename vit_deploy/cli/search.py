"""`vit-deploy search`: the rows of an `embed` Parquet file nearest to query images (no
torch, no Ray; pyarrow reads the file)."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import json_option, precision_option, provider_option, quiet_option, refuse_clobber, show_result
from vit_deploy.cli.params import InputPath


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@click.argument("index", type=InputPath("index file"))
@click.argument("queries", nargs=-1, required=True, type=InputPath("image"))
@click.option("--top-k", "k", type=click.IntRange(1, 10_000), default=5, show_default=True,
              help="Rows shown per query (1 to 10000), nearest first.")
@provider_option(measured=False)
@precision_option("The bundle's model to embed the queries with (the one that wrote the "
                  "index gives the same vectors).")
@json_option("The matches")
@quiet_option("only the matches, one line each (query, rank, path, similarity; "
              "tab-separated)")
def search(bundle: Path, index: Path, queries: tuple[Path, ...], k: int, provider: str,
           precision: str, json_out: Path | None, quiet: bool) -> None:
    """The rows of INDEX (a Parquet file `vit-deploy embed` wrote with BUNDLE) nearest to
    each of QUERIES, by the bundle's similarity (cosine for DINOv2, CLIP, SigLIP). Write
    the index first: vit-deploy embed dinov2-s photos/ --out photos.parquet

    \b
    Example:
      vit-deploy search dinov2-s photos.parquet query.jpg --top-k 5
    """
    try:
        from vit_deploy.ray.search import search as run_search
    except ImportError as e:
        raise click.UsageError(f"search reads Parquet with pyarrow ({e.name or e} is "
                               f"missing): pip install 'vit-deploy[ray]'") from None
    refuse_clobber({"--json": json_out}, bundles=[bundle], inputs=(index, *queries))
    result = run_search(bundle, index, queries, k=k, precision=precision, provider=provider)
    show_result(result, json_out, quiet)
