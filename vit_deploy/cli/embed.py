"""`vit-deploy embed`: pooled features, logits and top-k of many images to Parquet, in this
process or as a Ray Data job (`--ray`; imported only when it runs; the `ray` extra)."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import console, force_option, precision_option, provider_option, quiet_option, refuse_clobber
from vit_deploy.cli.params import MAX_BATCH, InputPath
from vit_deploy.ray import SHARD_SIZE


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@click.argument("images", nargs=-1, required=True, type=InputPath("image input"))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The Parquet file to write (atomically), one row per image.")
@provider_option(measured=False)
@precision_option("The bundle's model to run.")
@click.option("--top-k", type=click.IntRange(1, 1_000_000), default=5, show_default=True,
              help="Classes kept per image (1 to 1000000), best first.")
@click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=32, show_default=True,
              help=f"Images per model run (1 to {MAX_BATCH}).")
@click.option("--shard-size", type=click.IntRange(1, 1_000_000), default=SHARD_SIZE,
              show_default=True, help="Images per shard (1 to 1000000): the unit written "
              "atomically and skipped when the job is run again after a kill (what a kill "
              "loses at most).")
@click.option("--actors", type=click.IntRange(1, 4096), default=None,
              help="With --ray: sessions in the actor pool (1 to 4096; default: half the "
                   "cluster's CPUs over --cpus-per-actor).")
@click.option("--cpus-per-actor", type=click.FloatRange(0.01, 1024), default=None,
              help="With --ray: CPUs each session reserves (0.01 to 1024, default 1; its "
                   "ONNX Runtime threads: as many, at least one).")
@click.option("--ray", "ray_address", default=None, metavar="auto|local|HOST:PORT",
              help="Run as a Ray Data job: local (a cluster started in this process), auto "
              "(the one `ray start` runs here) or a head node's address; the bundle and "
              "image paths must exist on every node. Default: in this process, no Ray.")
@force_option("Replace --out if it exists.")
@quiet_option("only the file written")
def embed(bundle: Path, images: tuple[Path, ...], out: Path, provider: str, precision: str,
          top_k: int, batch: int, shard_size: int, actors: int | None,
          cpus_per_actor: float | None, ray_address: str | None, force: bool,
          quiet: bool) -> None:
    """Embed IMAGES (folders, image files, .txt lists of paths) with BUNDLE, in this process
    or (--ray) on a Ray cluster: pooled features, logits and top-k classes, one Parquet row
    per image (bad images: a row with its error). Run it again after a kill: written shards
    are kept.

    \b
    Example:
      vit-deploy embed dinov2-s photos/ --out features.parquet
      vit-deploy embed vit-B16-224 photos/ more.txt --out features.parquet --ray auto
    """
    from vit_deploy.progress import steps

    refuse_clobber({"--out": out}, bundles=[bundle], inputs=images)
    if out.exists() and not force:
        raise click.BadParameter(f"{str(out)!r} exists; pass --force to replace it",
                                 param_hint="--out")
    if ray_address is None and (actors is not None or cpus_per_actor is not None):
        raise click.UsageError("--actors and --cpus-per-actor size a Ray job: give --ray "
                               "local|auto|HOST:PORT with them (without --ray, embed runs "
                               "in this process)")
    try:
        from vit_deploy.ray.embed import EmbedOptions, embed as run_job
    except ImportError as e:
        raise click.UsageError(f"embed writes Parquet with pyarrow ({e.name or e} is "
                               f"missing): pip install 'vit-deploy[ray]'") from None
    address = None
    if ray_address is not None:
        try:
            from vit_deploy.ray.cluster import check_address
        except ImportError as e:
            raise click.UsageError(f"embed --ray needs Ray Data ({e.name or e} is missing): "
                                   f"pip install 'vit-deploy[ray]'") from None
        try:
            address = check_address(ray_address)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--ray") from None
    options = EmbedOptions(provider=provider, precision=precision, top_k=top_k, batch=batch,
                           shard_size=shard_size, actors=actors,
                           cpus_per_actor=1.0 if cpus_per_actor is None else cpus_per_actor,
                           address=address)
    with steps(quiet=quiet, title="embedding") as progress:
        report = run_job(bundle, list(images), out, options=options, progress=progress)
    if quiet:
        click.echo(report.out)
    else:
        console().print(str(report))
