"""Images -> normalised NCHW float32, by the bundle manifest's rule (numpy + Pillow)."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from vit_deploy.runtime.config import check_normalization
from vit_deploy.runtime.contract import MIN_CROP_PCT, RESIZE_RULES
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.sizes import MAX_SIDE, require_patch_multiple
from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError

ImageInput = Union[str, os.PathLike, bytes, bytearray, Image.Image, np.ndarray]

MAX_PIXELS = 89_478_485  # Pillow's own decompression-bomb bound (≈ 0.25 GiB of RGB)
# MAX_SIDE (16384, from sizes): the longest side a resize rule may give the model input.
_HIGH_DEPTH = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")  # grey modes scaled to 8 bits
_MESSAGE_CHARS = 300  # of a decoder's own message quoted in an ImageError
_RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
             "nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS}


class ImageError(VitDeployError, ValueError):
    """An input that is not a usable image: says which one and why."""

    exit_code = BAD_INPUT


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
    crop_pct: float | None = None  # resize to floor(side / crop_pct), then crop (timm's rule)
    # Called with the model input's (H, W) once it is known and before any pixel is resized
    # or allocated: a session passes its size check (patch multiples, memory guard), so a
    # size it would refuse is refused before gigabytes are spent preparing it.
    guard: Callable[[int, int], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        res = self.resolution
        res = (res, res) if isinstance(res, int) and not isinstance(res, bool) else res
        if not (isinstance(res, (tuple, list)) and len(res) == 2 and all(
                _is_int(v) and 1 <= v <= MAX_SIDE for v in res)):
            raise ValueError(f"resolution must be (height, width) of integers from 1 to "
                             f"{MAX_SIDE}, got {res!r}"[:200])
        object.__setattr__(self, "resolution", (int(res[0]), int(res[1])))
        if not (_is_int(self.patch_size) and 1 <= self.patch_size <= MAX_SIDE):
            raise ValueError(f"patch_size must be an integer from 1 to {MAX_SIDE}, got "
                             f"{self.patch_size!r}"[:200])
        try:  # numpy scalars and ints become floats; strings and None are refused
            mean, std = (tuple(float(v) for v in self.mean), tuple(float(v) for v in self.std))
            scale = float(self.scale)
        except (TypeError, ValueError):
            raise ValueError(f"mean, std and scale must be numbers, got mean {self.mean!r}, "
                             f"std {self.std!r}, scale {self.scale!r}"[:300]) from None
        check_normalization(mean, std, scale=scale)
        if len(mean) not in (1, 3):  # the image is RGB: one value for all, or one each
            raise ValueError(f"mean and std must hold 1 or 3 values (RGB), got {len(mean)}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "scale", scale)
        if self.resize not in RESIZE_RULES:
            raise ValueError(f"resize rule must be one of {RESIZE_RULES}, got {self.resize!r}")
        if self.interpolation not in _RESAMPLE:
            raise ValueError(f"interpolation must be one of {sorted(_RESAMPLE)}, got "
                             f"{self.interpolation!r}")
        if self.crop_pct is not None:
            cp = self.crop_pct
            if isinstance(cp, bool) or not isinstance(cp, (int, float, np.floating)) \
                    or not MIN_CROP_PCT <= cp <= 1:
                raise ValueError(f"crop_pct must be None or a number from {MIN_CROP_PCT} to 1, "
                                 f"got {cp!r}"[:200])
            if self.resize == "patch_multiple":
                raise ValueError("crop_pct must be None under the 'patch_multiple' rule (it "
                                 f"never crops), got {cp!r}")
            object.__setattr__(self, "crop_pct", float(cp))

    @classmethod
    def from_manifest(cls, manifest: Manifest, **overrides: Any) -> Preprocess:
        pre = manifest.preprocess
        fields = dict(resolution=pre.resolution, patch_size=manifest.io.patch_size,
                      mean=pre.mean, std=pre.std, resize=pre.resize,
                      interpolation=pre.interpolation, scale=pre.scale, crop_pct=pre.crop_pct)
        fields.update({k: v for k, v in overrides.items() if v is not None})
        if fields["resize"] == "patch_multiple":  # a rule given as an override: no crop
            fields["crop_pct"] = None
        return cls(**fields)

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(H, W) the image will have after resizing (and cropping)."""
        if self.resize != "patch_multiple":  # cropped (or squashed) to the resolution
            return self.resolution
        P = self.patch_size
        scale = min(self.resolution) / min(width, height)
        return (max(P, round(height * scale / P) * P), max(P, round(width * scale / P) * P))

    def __call__(self, image: ImageInput) -> np.ndarray:
        """One image -> (C, H, W) float32."""
        return self.array(load_image(image))

    def array(self, image: Image.Image) -> np.ndarray:
        x = self.pixels(image).astype(np.float32) * np.float32(self.scale)  # (H, W, C)
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(x.transpose(2, 0, 1))  # (C, H, W)

    def pixels(self, image: Image.Image) -> np.ndarray:
        """The (loaded) image resized and cropped to the model's size: (H, W, C) uint8."""
        (th, tw), (rh, rw) = _resize_plan(self, *image.size)  # refused here if too large
        if self.guard is not None:
            self.guard(th, tw)  # before anything is resized or allocated
        image = image.resize((rw, rh), _RESAMPLE[self.interpolation])
        if (rh, rw) != (th, tw):  # resized to cover the target: centre crop (floor offsets)
            left, top = (rw - tw) // 2, (rh - th) // 2
            image = image.crop((left, top, left + tw, top + th))
        require_patch_multiple(th, tw, self.patch_size)
        return np.asarray(image, dtype=np.uint8)

    def batches(self, images: Sequence[ImageInput]) -> list[tuple[list[int], np.ndarray]]:
        """Group same-size results: [(indices into `images`, (b, C, H, W) array), ...]."""
        return group_by_shape(list(enumerate(self(image) for image in images)))


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def group_by_shape(items: Sequence[tuple[int, np.ndarray]]) -> list[tuple[list[int], np.ndarray]]:
    """[(index, (C, H, W) array), ...] -> [(indices, (b, C, H, W) batch), ...], one per size."""
    groups: dict[tuple[int, ...], list[tuple[int, np.ndarray]]] = {}
    for i, x in items:
        groups.setdefault(x.shape, []).append((i, x))
    return [([i for i, _ in g], np.stack([x for _, x in g])) for g in groups.values()]


def load_image(src: ImageInput, *, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """A path, bytes, PIL image or HWC uint8 array -> upright RGB PIL image (fully decoded).

    Whatever goes wrong while decoding is an ImageError naming the input and the decoder's
    own error. Sizes are checked before any pixel is decoded (from the file's header): at
    least 1x1 and at most `max_pixels`. Of an animated or multi-page file only the first
    frame is decoded (of a PIL image, the frame it is on)."""
    if isinstance(src, Image.Image):
        return _decode(src, "PIL image", max_pixels)
    if isinstance(src, np.ndarray):
        return _from_array(src, max_pixels)
    if isinstance(src, (bytes, bytearray)):
        if not src:
            raise ImageError("image bytes are empty")
        return _decode(io.BytesIO(bytes(src)), "image bytes", max_pixels)
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        what = f"image {str(path)!r}"
        if not path.is_file():
            raise ImageError(f"{what} {_not_a_file(path)}")
        if path.stat().st_size == 0:
            raise ImageError(f"{what} is empty (0 bytes)")
        try:
            with open(path, "rb") as f:
                return _decode(f, what, max_pixels)
        except OSError as e:  # opening the file (what _decode raises is an ImageError)
            raise ImageError(f"{what} could not be read ({_describe(e)})") from e
    raise ImageError(f"expected a path, bytes, PIL image or HWC uint8 array, got "
                     f"{type(src).__name__}")


def _decode(src: Any, what: str, max_pixels: int) -> Image.Image:
    """A binary file, or a PIL image (maybe opened but not yet decoded) -> upright RGB.
    The one decode path: open, size check, decode, EXIF orientation, mode conversion."""
    with _decoder_errors(what):
        image = src if isinstance(src, Image.Image) else Image.open(src)
        _check_pixels(*image.size, what, max_pixels)  # from the header: nothing decoded yet
        image.load()  # the current (first) frame only; truncated files fail here, not later
        return _to_rgb(_upright(image), what)


@contextmanager
def _decoder_errors(what: str) -> Iterator[None]:
    """Any exception but KeyboardInterrupt / SystemExit -> ImageError naming `what` and the
    original error. Pillow's plugins raise nearly any type on hostile bytes (struct.error,
    SyntaxError, IndexError, NotImplementedError, MemoryError, ...), so no shorter list
    is safe."""
    try:
        yield
    except ImageError:
        raise
    except UnidentifiedImageError as e:
        raise ImageError(f"{what} is not an image format Pillow can read") from e
    except Image.DecompressionBombError as e:  # Pillow's own bound, checked in Image.open
        raise ImageError(f"{what} is over the limit of Pillow's decompression-bomb guard "
                         f"({_describe(e)})") from e
    except Exception as e:
        raise ImageError(f"{what} could not be decoded ({_describe(e)})") from e


def _describe(e: BaseException) -> str:
    """'struct.error: unpack requires ...': the type as one imports it, and its message."""
    kind = type(e)
    name = kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"
    text = str(e)
    if len(text) > _MESSAGE_CHARS:
        text = text[:_MESSAGE_CHARS] + "..."
    return f"{name}: {text}" if text else name


def _check_pixels(width: int, height: int, what: str, max_pixels: int) -> None:
    if width < 1 or height < 1:
        raise ImageError(f"{what} is {width}x{height}: expected at least 1x1 pixels")
    if width * height > max_pixels:
        raise ImageError(f"{what} is {width}x{height} = {width * height} pixels, over the limit "
                         f"of {max_pixels} (decompression-bomb guard)")


def _resize_plan(pre: Preprocess, width: int, height: int
                 ) -> tuple[tuple[int, int], tuple[int, int]]:
    """((H, W) of the model input, (H, W) the image is resized to before any crop), refused
    before resizing when a rule would blow the image up: under patch_multiple a 1x40000
    strip becomes a 224 x 8,960,000 input; under the center crop it is first scaled to cover
    the crop. Limits: MAX_SIDE for the model input's sides, MAX_PIXELS for the resized image."""
    if width < 1 or height < 1:
        raise ImageError(f"image is {width}x{height}: expected at least 1x1 pixels")
    th, tw = pre.target_size(width, height)
    rule = f"the {pre.resize!r} rule"
    if max(th, tw) > MAX_SIDE:
        raise ImageError(f"a {width}x{height} image becomes a {tw}x{th} input under {rule}; "
                         f"expected sides of at most {MAX_SIDE}")
    rh, rw = resized_size(pre.resize, pre.crop_pct, (th, tw), width, height)
    if rw * rh > MAX_PIXELS:
        raise ImageError(f"a {width}x{height} image is resized to {rw}x{rh} = {rw * rh} pixels "
                         f"under {rule}, over the limit of {MAX_PIXELS}")
    return (th, tw), (rh, rw)


def resized_size(rule: str, crop_pct: float | None, target: tuple[int, int], width: int,
                 height: int) -> tuple[int, int]:
    """(H, W) a width x height image is resized to before the centre crop to `target`.

    - shorter_side_center_crop, no crop_pct: scaled to just cover the target (sides rounded).
    - shorter_side_center_crop with crop_pct, as timm's eval transform (and Hugging Face's
      shortest_edge + crop_size): the scale size is floor(side / crop_pct) per target side;
      a square one is the shorter side's length, the longer side int(S * long / short)
      (torchvision's Resize(int), transformers' get_resize_output_image_size); otherwise
      timm's ResizeKeepRatio: both sides divided by min(h / Sh, w / Sw), rounded.
    - squash: each side to floor(side / crop_pct) (crop_pct None: the target itself).
    - patch_multiple: the target (never cropped)."""
    th, tw = target
    if rule == "patch_multiple":
        return th, tw
    sh, sw = (math.floor(th / crop_pct), math.floor(tw / crop_pct)) if crop_pct is not None else (th, tw)
    if rule == "squash":
        return max(th, sh), max(tw, sw)
    if crop_pct is None:
        s = max(th / height, tw / width)
        return max(th, round(height * s)), max(tw, round(width * s))
    if sh == sw:
        if width <= height:
            rh, rw = int(sw * height / width), sw
        else:
            rh, rw = sh, int(sh * width / height)
    else:
        ratio = min(height / sh, width / sw)
        rh, rw = round(height / ratio), round(width / ratio)
    return max(th, rh), max(tw, rw)


def _upright(image: Image.Image) -> Image.Image:
    """Apply the EXIF Orientation tag (cameras store photos sideways and set it)."""
    if image.getexif().get(ExifTags.Base.Orientation, 1) == 1:
        return image  # the common case; exif_transpose would return a copy
    return ImageOps.exif_transpose(image)  # a new image: a caller's PIL image is not changed


def _to_rgb(image: Image.Image, what: str) -> Image.Image:
    """Any Pillow mode -> RGB: alpha (and palette or colour-key transparency) composited on
    white, 16-bit and float grey scaled to 8 bits (see _to_8bit)."""
    if image.mode in _HIGH_DEPTH:
        image = _to_8bit(image)
    elif image.mode == "La":
        image = image.convert("LA")  # premultiplied: Pillow converts it to LA only
    if image.has_transparency_data:
        rgba = image.convert("RGBA")  # composite on white rather than dropping alpha to black
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode == "RGB":
        return image
    try:
        return image.convert("RGB")
    except (ValueError, OSError) as e:
        raise ImageError(f"{what} has mode {image.mode!r}, which cannot become RGB "
                         f"({_describe(e)})") from e


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit or float grey -> 8-bit "L", scaling the range rather than clipping it:
    - "I;16", "I;16B", "I;16L", "I;16N" and "I" (the modes Pillow gives 16-bit PNG and TIFF)
      are read as 0..65535: v -> round(v * 255 / 65535), so 65535 -> 255, 257 * k -> k,
      32768 -> 128; "I" values outside 0..65535 are clipped.
    - "F" is read as 0..1 (the float-image convention): v -> round(v * 255), values outside
      0..1 clipped, NaN -> 0."""
    a = np.asarray(image)
    if image.mode == "F":
        x = np.nan_to_num(np.clip(a, 0.0, 1.0), nan=0.0) * np.float32(255)
    else:
        x = np.clip(a, 0, 65535).astype(np.float32) * np.float32(255 / 65535)
    return Image.fromarray(np.rint(x).astype(np.uint8), mode="L")


def _from_array(a: np.ndarray, max_pixels: int = MAX_PIXELS) -> Image.Image:
    if a.dtype != np.uint8:
        raise ImageError(f"image arrays must be uint8 HWC (0..255), got dtype {a.dtype}")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4))):
        raise ImageError(f"image arrays must be HxW, HxWx1, HxWx3 or HxWx4, got shape {a.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ImageError(f"image array is empty: shape {a.shape}")
    _check_pixels(a.shape[1], a.shape[0], "image array", max_pixels)  # before copying it
    with _decoder_errors("image array"):
        return _to_rgb(Image.fromarray(np.ascontiguousarray(a)), "image array")


def _not_a_file(path: Path) -> str:
    """Why `path` is not an image file, in words: missing, or what it is instead."""
    from vit_deploy.runtime.files import file_kind

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "is a broken link" if os.path.islink(path) else "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return f"is {file_kind(mode)}, not an image file"
