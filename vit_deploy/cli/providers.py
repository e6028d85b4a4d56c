"""`vit-deploy providers`: what ONNX Runtime lists here, and what really runs."""

from __future__ import annotations

import json

import click

from vit_deploy.cli.options import console, json_flag


@click.command()
@json_flag
def providers(as_json: bool) -> None:
    """What this onnxruntime lists, and whether a session really runs on each here."""
    from vit_deploy.runtime.providers import probe_all

    report = probe_all()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    console().print(report)
