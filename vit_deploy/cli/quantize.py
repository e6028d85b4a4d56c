"""`vit-deploy quantize`: add fp16 / int8 / int4 models to a bundle, each checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from vit_deploy.cli.options import force_option, quant_options, quiet_option
from vit_deploy.cli.params import InputPath, PrecisionList
from vit_deploy.cli.quant_flags import add_precisions

QUIET = "nothing is printed on success; a failure is one line on stderr (exit 1)"


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@click.option("--precision", "precisions", type=PrecisionList(), required=True,
              help="Comma-separated: fp16, int8 (dynamic), int8-static, int4, or all.")
@quant_options
@force_option("Write precisions even if they fail the policy.")
@quiet_option(QUIET)
def quantize(bundle: Path, precisions: tuple[str, ...], force: bool, quiet: bool,
             **quant: Any) -> None:
    """Add quantised / fp16 models to BUNDLE, each judged against its fp32 model on real
    images (held-out photographs shipped with vit-deploy, or --eval DIR).

    Only the encoder's linear layers are quantised. A precision outside the tolerance
    policy (docs/check-and-bench.md) is not written unless --force. Exit code: 0 every
    precision passed and was written; 1 none passed; 3 some passed and were written, the
    others did not (the report says which). Files in BUNDLE that vit-deploy did not write
    are kept.

    \b
    Example:
      vit-deploy quantize vit-B16-224 --precision fp16,int8 --calib photos
    """
    add_precisions(bundle, precisions, force=force, quiet=quiet, **quant)
