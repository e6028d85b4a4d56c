"""`vit-deploy providers`: which ONNX Runtime package, what it lists, what really runs;
OpenVINO's devices where the openvino package is installed."""

from __future__ import annotations

import json
from pathlib import Path

import click

from vit_deploy.cli.options import (console, emit_json, json_option, json_to_stdout,
                                    quiet_option, refuse_clobber)


@click.command()
@json_option("The report")
@quiet_option("only the aliases of the providers usable here, one a line")
def providers(json_out: Path | None, quiet: bool) -> None:
    """Which package installed onnxruntime (onnxruntime-gpu, onnxruntime, ...), what it
    lists, and whether a session really runs on each provider here; where the openvino
    package is installed, its devices too (openvino, openvino-gpu, ...).

    \b
    Example:
      vit-deploy providers --json providers.json
    """
    from vit_deploy.runtime.providers import probe_all

    refuse_clobber({"--json": json_out})
    report = probe_all()
    emit_json(json_out, json.dumps(report.to_dict(), indent=2))
    if json_to_stdout(json_out):
        return
    if quiet:
        for r in report.results:
            if r.usable:
                click.echo(r.alias)
        return
    console().print(report)
