"""`vit-deploy providers`: which ONNX Runtime package, what it lists, what really runs."""

from __future__ import annotations

import json

import click

from vit_deploy.cli.options import console, json_flag


@click.command()
@json_flag
def providers(as_json: bool) -> None:
    """Which package installed onnxruntime (onnxruntime-gpu, onnxruntime, ...), what it
    lists, and whether a session really runs on each provider here."""
    from vit_deploy.runtime.providers import probe_all

    report = probe_all()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    console().print(report)
