"""`vit-deploy triton`: a Triton Inference Server model repository from a bundle."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import FORCE_INTO_OUT, console, force_option, precision_option, quiet_option
from vit_deploy.cli.params import MAX_BATCH, InputPath


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@click.option("--out", type=click.Path(path_type=Path), required=True, metavar="DIR",
              help="Model repository directory to write.")
@precision_option("The bundle's model to put in the repository.")
@click.option("--name", default=None, help="Model name in the repository (default: bundle name).")
@click.option("--max-batch", type=click.IntRange(1, MAX_BATCH), default=8, show_default=True,
              help="Triton's max_batch_size.")
@click.option("--instances", default="cpu:1", show_default=True, metavar="KIND:N,...",
              help="Model instances per device kind (cpu, gpu), e.g. cpu:2,gpu:1.")
@click.option("--dynamic-batching-us", type=click.IntRange(0, 10_000_000), default=1000,
              show_default=True, help="Triton's max queue delay; batch-coupled precisions "
              "(dynamic int8) get none.")
@click.option("--accelerator", type=click.Choice(["none", "cuda", "tensorrt", "tensorrt-fp16"]),
              default="none", show_default=True, help="GPU execution accelerator setting.")
@force_option(FORCE_INTO_OUT)
@quiet_option("only the model's directory written (REPO/NAME); notes go to stderr")
def triton(bundle: Path, out: Path, precision: str, name: str | None, max_batch: int,
           instances: str, dynamic_batching_us: int, accelerator: str, force: bool,
           quiet: bool) -> None:
    """Write a Triton Inference Server model repository (ONNX Runtime backend).

    \b
    Example:
      vit-deploy triton vit-B16-224 --out models --precision int8 --instances cpu:2
    """
    from vit_deploy.triton import parse_instances, triton_repository

    repo, name, notes = triton_repository(
        bundle, out, precision=precision, name=name, max_batch=max_batch,
        instances=parse_instances(instances), dynamic_batching_us=dynamic_batching_us,
        accelerator=None if accelerator == "none" else accelerator, force=force)
    if quiet:
        click.echo(f"{repo}/{name}")
        for note in notes:
            click.echo(f"note: {note}", err=True)
        return
    screen = console()
    screen.print(f"wrote {repo}/{name}/config.pbtxt and {repo}/{name}/1/model.onnx")
    for note in notes:
        screen.print(f"note: {note}")
