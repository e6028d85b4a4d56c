"""vit-deploy command line: one module per command (export.py, bench.py, ...), loaded when
it runs; option groups shared by several commands in options.py, parameter types in
params.py, the vocabulary in vocabulary.py; errors mapped to exit codes in group.py. A command parses its options, calls one library function and prints
what it returns (reports render themselves, rich's `__rich__`)."""

from __future__ import annotations

import click

from vit_deploy.cli.group import Main


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vit-deploy")
def main() -> None:
    """Take a Vision Transformer from PyTorch to ONNX Runtime, with proof it still matches."""


__all__ = ["main"]
