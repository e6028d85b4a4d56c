"""`vit-deploy info`: what a bundle holds."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import console


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--no-verify", is_flag=True, help="Skip the sha256 check of the files.")
def info(bundle: Path, as_json: bool, no_verify: bool) -> None:
    """Describe a bundle: model, inputs, files, parity, tool versions."""
    from vit_deploy.info import BundleSummary
    from vit_deploy.runtime.manifest import load_manifest

    manifest = load_manifest(bundle, verify=not no_verify)
    if as_json:
        click.echo(manifest.to_json(), nl=False)
        return
    console().print(BundleSummary(manifest, str(bundle)))
