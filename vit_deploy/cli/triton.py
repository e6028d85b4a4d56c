"""`vit-deploy triton`: a Triton Inference Server model repository from a bundle."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import FORCE_INTO_OUT, MAX_BATCH, console, force_option


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Model repository directory to write.")
@click.option("--precision", default="fp32", show_default=True)
@click.option("--name", default=None, help="Model name in the repository (default: bundle name).")
@click.option("--max-batch", type=click.IntRange(1, MAX_BATCH), default=8, show_default=True)
@click.option("--instances", default="cpu:1", show_default=True, help="e.g. cpu:2,gpu:1")
@click.option("--dynamic-batching-us", type=click.IntRange(0, 10_000_000), default=1000,
              show_default=True, help="Triton's max queue delay; batch-coupled precisions "
              "(dynamic int8) get none.")
@click.option("--accelerator", type=click.Choice(["none", "cuda", "tensorrt", "tensorrt-fp16"]),
              default="none", show_default=True, help="GPU execution accelerator setting.")
@force_option(FORCE_INTO_OUT)
def triton(bundle: Path, out: Path, precision: str, name: str | None, max_batch: int,
           instances: str, dynamic_batching_us: int, accelerator: str, force: bool) -> None:
    """Write a Triton Inference Server model repository (ONNX Runtime backend)."""
    from vit_deploy.triton import parse_instances, triton_repository

    repo, name, notes = triton_repository(
        bundle, out, precision=precision, name=name, max_batch=max_batch,
        instances=parse_instances(instances), dynamic_batching_us=dynamic_batching_us,
        accelerator=None if accelerator == "none" else accelerator, force=force)
    screen = console()
    screen.print(f"wrote {repo}/{name}/config.pbtxt and {repo}/{name}/1/model.onnx")
    for note in notes:
        screen.print(f"note: {note}")
