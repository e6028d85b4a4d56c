"""Synthetic photographs for preprocessing tests: smooth gradients, a disc and noise, at
sizes of every aspect (edges and texture at every scale)."""

from __future__ import annotations

import numpy as np
from PIL import Image

SIZES = [(640, 480), (480, 640), (300, 200), (97, 131), (1000, 250), (224, 224), (33, 517)]


def photo(w: int, h: int, seed: int = 0) -> Image.Image:
    """Smooth gradients, a disc and noise: edges and texture at every scale."""
    rng = np.random.default_rng(seed + w * 7 + h)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = np.hypot(x - w / 2, y - h / 3) < min(w, h) / 4
    a = np.stack([255 * x / w, 255 * y / h, 128 + 100 * np.sin(x / 7) * np.cos(y / 5)], -1)
    a[r] = 255 - a[r]
    a += rng.normal(0, 12, a.shape)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
