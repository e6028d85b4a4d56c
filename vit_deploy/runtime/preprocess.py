"""Images -> normalised NCHW float32, by the bundle manifest's rule (numpy + Pillow)."""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
from PIL import Image, UnidentifiedImageError

from vit_deploy.sizes import check_input_size

ImageInput = Union[str, os.PathLike, bytes, bytearray, Image.Image, np.ndarray]

RESIZE_RULES = ("shorter_side_center_crop", "patch_multiple")
MAX_PIXELS = 89_478_485  # Pillow's own decompression-bomb bound (≈ 0.25 GiB of RGB)
_RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
             "nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS}


class ImageError(ValueError):
    """An input that is not a usable image: says which one and why."""


@dataclass(frozen=True, kw_only=True)
class Preprocess:
    """How pixels become model input; read from (and written to) the manifest."""

    resolution: tuple[int, int]  # (H, W) target; for patch_multiple the shorter side's target
    patch_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: str = "shorter_side_center_crop"
    interpolation: str = "bicubic"
    scale: float = 1 / 255

    def __post_init__(self) -> None:
        if self.resize not in RESIZE_RULES:
            raise ValueError(f"resize rule must be one of {RESIZE_RULES}, got {self.resize!r}")
        if self.interpolation not in _RESAMPLE:
            raise ValueError(f"interpolation must be one of {sorted(_RESAMPLE)}, got "
                             f"{self.interpolation!r}")

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], **overrides: Any) -> Preprocess:
        pre = manifest["preprocess"]
        fields = dict(resolution=tuple(pre["resolution"]), patch_size=manifest["io"]["patch_size"],
                      mean=tuple(pre["mean"]), std=tuple(pre["std"]),
                      resize=pre.get("resize", "shorter_side_center_crop"),
                      interpolation=pre.get("interpolation", "bicubic"),
                      scale=pre.get("scale", 1 / 255))
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**fields)

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(H, W) the image will have after resizing (and cropping)."""
        if self.resize == "shorter_side_center_crop":
            return self.resolution
        P = self.patch_size
        scale = min(self.resolution) / min(width, height)
        return (max(P, round(height * scale / P) * P), max(P, round(width * scale / P) * P))

    def __call__(self, image: ImageInput) -> np.ndarray:
        """One image -> (C, H, W) float32."""
        return self.array(load_image(image))

    def array(self, image: Image.Image) -> np.ndarray:
        th, tw = self.target_size(*image.size)
        resample = _RESAMPLE[self.interpolation]
        if self.resize == "shorter_side_center_crop":
            w, h = image.size
            s = max(th / h, tw / w)
            rw, rh = max(tw, round(w * s)), max(th, round(h * s))
            image = image.resize((rw, rh), resample)
            left, top = (rw - tw) // 2, (rh - th) // 2
            image = image.crop((left, top, left + tw, top + th))
        else:
            image = image.resize((tw, th), resample)
        x = np.asarray(image, dtype=np.float32) * np.float32(self.scale)  # (H, W, C)
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        check_input_size(th, tw, self.patch_size)
        return np.ascontiguousarray(x.transpose(2, 0, 1))  # (C, H, W)

    def batches(self, images: Sequence[ImageInput]) -> list[tuple[list[int], np.ndarray]]:
        """Group same-size results: [(indices into `images`, (b, C, H, W) array), ...]."""
        return group_by_shape(list(enumerate(self(image) for image in images)))


def group_by_shape(items: Sequence[tuple[int, np.ndarray]]) -> list[tuple[list[int], np.ndarray]]:
    """[(index, (C, H, W) array), ...] -> [(indices, (b, C, H, W) batch), ...], one per size."""
    groups: dict[tuple[int, ...], list[tuple[int, np.ndarray]]] = {}
    for i, x in items:
        groups.setdefault(x.shape, []).append((i, x))
    return [([i for i, _ in g], np.stack([x for _, x in g])) for g in groups.values()]


def load_image(src: ImageInput, *, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """A path, bytes, PIL image or HWC uint8 array -> RGB PIL image (fully decoded)."""
    if isinstance(src, Image.Image):
        return _to_rgb(src, "PIL image")
    if isinstance(src, np.ndarray):
        return _from_array(src)
    if isinstance(src, (bytes, bytearray)):
        if not src:
            raise ImageError("image bytes are empty")
        return _decode(io.BytesIO(bytes(src)), "image bytes", max_pixels)
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if not path.is_file():
            raise ImageError(f"image {str(path)!r} does not exist or is not a file")
        if path.stat().st_size == 0:
            raise ImageError(f"image {str(path)!r} is empty (0 bytes)")
        with open(path, "rb") as f:
            return _decode(f, f"image {str(path)!r}", max_pixels)
    raise ImageError(f"expected a path, bytes, PIL image or HWC uint8 array, got "
                     f"{type(src).__name__}")


def _decode(fp: Any, what: str, max_pixels: int) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(fp)
            w, h = image.size
            if w * h > max_pixels:
                raise ImageError(f"{what} is {w}x{h} = {w * h} pixels, over the limit of "
                                 f"{max_pixels} (decompression-bomb guard)")
            image.load()  # decode now: truncated files fail here, not later
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"{what} is too large: {e}") from None
    except UnidentifiedImageError:
        raise ImageError(f"{what} is not an image format Pillow can read") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"{what} is corrupt or truncated: {e}") from None
    return _to_rgb(image, what)


def _to_rgb(image: Image.Image, what: str) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")  # composite on white rather than dropping alpha to black
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    try:
        return image.convert("RGB")
    except (ValueError, OSError) as e:
        raise ImageError(f"{what} has mode {image.mode!r}, which cannot become RGB: {e}") from None


def _from_array(a: np.ndarray) -> Image.Image:
    if a.dtype != np.uint8:
        raise ImageError(f"image arrays must be uint8 HWC (0..255), got dtype {a.dtype}")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4))):
        raise ImageError(f"image arrays must be HxW, HxWx1, HxWx3 or HxWx4, got shape {a.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ImageError(f"image array is empty: shape {a.shape}")
    return _to_rgb(Image.fromarray(np.ascontiguousarray(a)), "image array")
