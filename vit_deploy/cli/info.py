"""`vit-deploy info`: what a bundle holds."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import console, emit_json, json_option, json_to_stdout, quiet_option, refuse_clobber
from vit_deploy.cli.params import InputPath


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@json_option("The manifest")
@click.option("--no-verify", is_flag=True, help="Skip the sha256 check of the files.")
@quiet_option("nothing is printed; the exit code says whether the bundle verifies")
def info(bundle: Path, json_out: Path | None, no_verify: bool, quiet: bool) -> None:
    """Describe a bundle: model, inputs, files, parity, tool versions.

    \b
    Example:
      vit-deploy info vit-B16-224 --json | python -m json.tool
    """
    from vit_deploy.info import BundleSummary
    from vit_deploy.runtime.manifest import load_manifest

    refuse_clobber({"--json": json_out}, bundles=[bundle])
    manifest = load_manifest(bundle, verify=not no_verify)
    emit_json(json_out, manifest.to_json())
    if not quiet and not json_to_stdout(json_out):
        console().print(BundleSummary(manifest, str(bundle)))
