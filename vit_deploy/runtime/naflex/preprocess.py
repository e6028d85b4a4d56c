"""SigLIP 2 NaFlex inputs, torch-free: the graph's contract, and images -> its three inputs
exactly as transformers' Siglip2ImageProcessor(Pil) makes them (numpy + Pillow).

NaFlex keeps each image's aspect ratio: it is resized so that its patch grid (gh, gw) is the
largest one of at most `max_num_patches` patches (each side a multiple of the patch size,
at least one patch), its patches are flattened (row, column, channel) in raster order and
padded with zeros to `max_num_patches`, and a mask marks the real ones. Images of any
aspect ratio share one batch.
Shapes in comments: B batch, N max_num_patches, P patch, C channels (3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from PIL import Image

from vit_deploy.runtime.config import check_normalization
# the graph's contract: transformers' input names, so the processor's output feeds it as is
from vit_deploy.runtime.naflex.contract import MAX_NUM_PATCHES, NAFLEX_INPUTS, PATCH_BUDGET_LIMIT
from vit_deploy.runtime.preprocess import ImageInput, load_image

_SEARCH_EPS = 1e-5  # transformers' get_image_size_for_max_num_patches: binary-search step


class NaFlexBatch(NamedTuple):
    """The graph's three inputs for a batch of images."""

    pixel_values: np.ndarray  # (B, N, P*P*C) float32
    pixel_attention_mask: np.ndarray  # (B, N) int32
    spatial_shapes: np.ndarray  # (B, 2) int64

    def feeds(self) -> dict[str, np.ndarray]:
        return dict(zip(NAFLEX_INPUTS, self))


def size_for_max_num_patches(height: int, width: int, patch: int, max_num_patches: int,
                             ) -> tuple[int, int]:
    """(H, W) an image is resized to: transformers' get_image_size_for_max_num_patches, the
    same binary search over the scale (the same floats, so the same sizes)."""
    def scaled(scale: float, size: int) -> int:
        return int(max(patch, math.ceil(size * scale / patch) * patch))

    lo, hi = _SEARCH_EPS / 10, 100.0
    while hi - lo >= _SEARCH_EPS:
        scale = (lo + hi) / 2
        if (scaled(scale, height) / patch) * (scaled(scale, width) / patch) <= max_num_patches:
            lo = scale
        else:
            hi = scale
    return scaled(lo, height), scaled(lo, width)


@dataclass(frozen=True, kw_only=True)
class NaFlexPreprocess:
    """Images -> NaFlexBatch: Siglip2ImageProcessor's defaults (bilinear with Pillow's
    antialiasing filter, 1/255, mean = std = 0.5)."""

    patch_size: int = 16
    max_num_patches: int = MAX_NUM_PATCHES
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    scale: float = 1 / 255

    def __post_init__(self) -> None:
        for name, limit in (("patch_size", 1024), ("max_num_patches", PATCH_BUDGET_LIMIT)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= limit:
                raise ValueError(f"{name} must be an integer from 1 to {limit}, got {v!r}"[:200])
        check_normalization(self.mean, self.std, scale=self.scale)
        if len(self.mean) not in (1, 3):
            raise ValueError(f"mean and std must hold 1 or 3 values (RGB), got {len(self.mean)}")

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(gh, gw): the patch grid a width x height image gets."""
        h, w = size_for_max_num_patches(height, width, self.patch_size, self.max_num_patches)
        return h // self.patch_size, w // self.patch_size

    def patches(self, image: ImageInput) -> tuple[np.ndarray, tuple[int, int]]:
        """One image -> (its patches (gh * gw, P*P*C) float32, (gh, gw))."""
        image = load_image(image)
        P = self.patch_size
        gh, gw = self.grid(*image.size)
        resized = image.resize((gw * P, gh * P), Image.Resampling.BILINEAR)
        # transformers' PIL backend: rescaled in float64, cast to float32, then normalised
        # in float32 (the same roundings, so the same floats)
        x = (np.asarray(resized, np.uint8).astype(np.float64) * self.scale).astype(np.float32)
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        x = x.reshape(gh, P, gw, P, -1).transpose(0, 2, 1, 3, 4)  # (gh, gw, P, P, C)
        return np.ascontiguousarray(x.reshape(gh * gw, -1), dtype=np.float32), (gh, gw)

    def __call__(self, images: Sequence[ImageInput]) -> NaFlexBatch:
        """Images (any sizes and aspect ratios) -> one batch, padded to max_num_patches."""
        if isinstance(images, (str, bytes, bytearray, Image.Image, np.ndarray)):
            images = [images]
        if not images:
            raise ValueError("expected at least one image, got none")
        N, P = self.max_num_patches, self.patch_size
        values = np.zeros((len(images), N, P * P * 3), np.float32)
        mask = np.zeros((len(images), N), np.int32)
        shapes = np.zeros((len(images), 2), np.int64)
        for i, image in enumerate(images):
            patches, grid = self.patches(image)
            values[i, :len(patches)], mask[i, :len(patches)], shapes[i] = patches, 1, grid
        return NaFlexBatch(values, mask, shapes)
