"""`vit-deploy predict`: classify images, or write their feature maps; no torch."""

from __future__ import annotations

from pathlib import Path

import click

from vit_deploy.cli.options import force_option, json_option, precision_option, provider_option, quiet_option, refuse_clobber, show_result, threads_option
from vit_deploy.cli.params import MAX_PATCH, RESOLUTION, InputPath, floats
from vit_deploy.runtime.contract import TARGETS


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@click.argument("images", nargs=-1, required=True, type=InputPath("image"))
@provider_option(measured=False)
@click.option("--fallback", is_flag=True, help="Run on what ONNX Runtime falls back to (CPU) "
              "when none of --provider is active (a list already runs on its first active "
              "provider).")
@precision_option("The bundle's model to run (quantize adds the others).")
@click.option("--top-k", type=click.IntRange(1, 1_000_000), default=5, show_default=True,
              help="Classes shown per image, most probable first.")
@click.option("--resize", type=click.Choice(["shorter_side_center_crop", "patch_multiple"]),
              default=None, help="Override the manifest's resize rule.")
@click.option("--res", "resolution", type=RESOLUTION, default=None,
              help="Override the manifest's resolution, N or HxW (dynamic bundles take any "
                   "multiple of the patch size). Needed for a bare .onnx file.")
@click.option("--mean", default=None, help="Per-channel mean, e.g. 0.485,0.456,0.406 (a bare "
              ".onnx file has no manifest to say it).")
@click.option("--std", default=None, help="Per-channel std, e.g. 0.229,0.224,0.225.")
@click.option("--patch", type=click.IntRange(1, MAX_PATCH), default=None,
              help="Patch size of a bare .onnx file that does not record it (one not "
                   "exported by vit-deploy).")
@threads_option
@click.option("--target", "predict_target", type=click.Choice(["auto", "none", *TARGETS]),
              default="auto", show_default=True, help="Bucket graphs to use: auto (the "
              "provider's target, if the bundle has it), none (the dynamic graph), or a name.")
@json_option("The predictions")
@click.option("--features", "features_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE.npz", help="Also write each image's dense outputs "
              "(patch_tokens, layer_N; [width, grid_h, grid_w], aspect ratio kept) to this "
              ".npz file.")
@force_option("Replace an existing --features file.")
@quiet_option("only the predictions, one line per image and class (image, rank, class, "
              "label, probability; tab-separated), and the --features file written")
def predict(bundle: Path, images: tuple[Path, ...], provider: str, fallback: bool,
            precision: str, top_k: int, resize: str | None, resolution: tuple[int, int] | None,
            mean: str | None, std: str | None, patch: int | None, threads: int | None,
            json_out: Path | None, features_file: Path | None, force: bool, quiet: bool,
            predict_target: str = "auto") -> None:
    """Classify IMAGES with a bundle, or a .onnx file exported by vit-deploy (no torch);
    with --features, write their patch-token feature maps.

    \b
    Example:
      vit-deploy predict vit-B16-224 cat.jpg dog.jpg --top-k 3 --provider cuda,cpu
    """
    from vit_deploy.predict import PredictOptions, predict as run_predict

    refuse_clobber({"--features": features_file, "--json": json_out}, bundles=[bundle],
                   inputs=images)
    if features_file is not None and features_file.exists() and not force:
        raise click.BadParameter(f"{features_file} exists; pass --force to replace it",
                                 param_hint="--features")
    options = PredictOptions(provider=provider, fallback=fallback, precision=precision,
                             top_k=top_k, target=predict_target, threads=threads,
                             resize=resize, resolution=resolution, mean=floats(mean),
                             std=floats(std), patch=patch, features=features_file)
    result = run_predict(bundle, images, options)
    show_result(result, json_out, quiet)
