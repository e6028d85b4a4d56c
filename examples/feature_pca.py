"""Patch features of an image as a picture: the classic DINOv2 visualisation.

The bundle's `patch_tokens` (batch, width, grid_h, grid_w) are reduced to their three
principal components, which become the red, green and blue of each patch; the result is
shown beside the image. Only the runtime, numpy and Pillow: no torch.

    vit-deploy export --checkpoint path/to/dinov2 --out dino      # patch_tokens by default
    python examples/feature_pca.py dino photo.jpg features.png

A classifier bundle needs `--outputs logits,patch_tokens` at export.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from PIL import Image

from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.preprocess import load_image


def principal_colours(grid: np.ndarray) -> np.ndarray:
    """(D, gh, gw) features -> (gh, gw, 3) uint8: the first three principal components of
    the patch vectors, each stretched to 0..255 (robustly: 1st to 99th percentile)."""
    D, gh, gw = grid.shape
    x = grid.reshape(D, -1).T.astype(np.float64)  # (N, D), one row per patch
    x -= x.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    pcs = x @ vt[:3].T  # (N, 3)
    if pcs.shape[1] < 3:  # fewer patches than 3 components: pad with grey
        pcs = np.pad(pcs, ((0, 0), (0, 3 - pcs.shape[1])))
    low, high = np.percentile(pcs, 1, axis=0), np.percentile(pcs, 99, axis=0)
    scaled = np.clip((pcs - low) / np.maximum(high - low, 1e-12), 0, 1)
    return (scaled.reshape(gh, gw, 3) * 255).round().astype(np.uint8)


def side_by_side(image: Image.Image, colours: np.ndarray, height: int = 256) -> Image.Image:
    """The image and its feature picture (nearest-neighbour: one block per patch)."""
    w = round(image.width * height / image.height)
    left = image.convert("RGB").resize((w, height), Image.Resampling.BICUBIC)
    right = Image.fromarray(colours).resize((w, height), Image.Resampling.NEAREST)
    out = Image.new("RGB", (2 * w + 8, height), "white")
    out.paste(left, (0, 0))
    out.paste(right, (w + 8, 0))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("image")
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("--output", default="patch_tokens",
                        help="which dense output: patch_tokens or layer_N")
    args = parser.parse_args(argv)
    try:
        with ViTSession(args.bundle) as session:
            grid = session.features(args.image, output=args.output)[0]  # (D, gh, gw)
        picture = side_by_side(load_image(args.image), principal_colours(grid))
        picture.save(args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.image}: {args.output} grid {grid.shape[1]}x{grid.shape[2]} of {grid.shape[0]} "
          f"features -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
