"""Golden references at export (and per target bucket): PyTorch fp32 outputs for inputs
regenerated from a seed, and for two real photographs stored as pixels
(runtime/references.py reads them, torch-free)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.manifest_parts import PreprocessSpec
from vit_deploy.runtime.references import (MAX_FRACTION, REFERENCE_BATCH, REFERENCES_FILE,
                                           ReferenceCase, ReferencePixels, References,
                                           mulberry32_uniform, pack)

SEEDS = {"deploy": 1, "native": 2, "non-square": 3}
Forward = Callable[[np.ndarray], object]


def source() -> str:
    return f"pytorch fp32 (torch {torch.__version__.split('+')[0]})"


def reference_sizes(cfg: ViTConfig, deploy: tuple[int, int], static: bool
                    ) -> list[tuple[str, tuple[int, int]]]:
    """(name, size): the deploy size, the native one if different, one non-square size
    (the native grid with three quarters of its columns, else one column more); a static
    bundle takes only its deploy size."""
    if static:
        return [("deploy", deploy)]
    P = cfg.patch_size
    gh, gw = cfg.grid_size
    wide = (P * gh, P * max(1, (3 * gw) // 4))
    if wide[0] == wide[1]:
        wide = (P * gh, P * (gw + 1))
    out = {"deploy": deploy}
    if tuple(cfg.img_size) != tuple(deploy):
        out["native"] = tuple(cfg.img_size)
    if wide not in out.values():
        out["non-square"] = wide
    return list(out.items())


def _named(outputs: object, names: Sequence[str]) -> dict[str, np.ndarray]:
    if isinstance(outputs, Mapping):
        return {n: np.asarray(outputs[n]) for n in names}
    return {names[0]: np.asarray(outputs)}


def golden_references(forward: Forward, sizes: Sequence[tuple[str, tuple[int, int]]], *,
                      channels: int, output_names: Sequence[str], budget_bytes: int,
                      target: str | None = None, seeds: Mapping[str, int] = SEEDS,
                      used_bytes: int = 0,
                      ) -> tuple[list[tuple[ReferenceCase, dict[str, np.ndarray]]], list[str]]:
    """(case, outputs) per size that fits in `budget_bytes` beside `used_bytes` already
    stored, and a note per size left out (dense outputs at large sizes)."""
    cases, notes, total = [], [], used_bytes
    for i, (name, hw) in enumerate(sizes):
        shape = (REFERENCE_BATCH, channels, *hw)
        seed = seeds.get(name, 100 + i)
        x = mulberry32_uniform(seed, shape)
        outputs = _named(forward(x), output_names)
        size = sum(a.size * 4 for a in outputs.values())
        if total + size > budget_bytes:
            notes.append(f"reference case {name} ({hw[0]}x{hw[1]}, {size} bytes) left out: "
                         f"over the bound of {budget_bytes} bytes ({MAX_FRACTION:.0%} of the "
                         f"fp32 model)")
            continue
        total += size
        cases.append((ReferenceCase(name=name, seed=seed, shape=shape, outputs={},
                                    target=target), outputs))
    return cases, notes


# Two of the held-out photographs shipped with the package (vit_deploy/data/photos): a
# colour one and a portrait, both public domain / CC0.
REFERENCE_PHOTOS = ("eval-chelsea.jpg", "eval-hopper.jpg")
PHOTO_CASE = "photos"
# The photographs' uint8 pixels have their own bound: the larger of the outputs' bound and
# this (ViT-B/16 at 448: 1.2 MB of pixels, 0.4 % of the model; a tiny test model at 48x64:
# 18 KB, more than 5 % of its 0.3 MB)
PIXEL_ALLOWANCE = 64 * 1024


def photo_reference(forward: Forward, resolution: tuple[int, int], preprocess: PreprocessSpec,
                    *, patch_size: int, channels: int, output_names: Sequence[str],
                    budget_bytes: int, used_bytes: int = 0
                    ) -> tuple[list[tuple[ReferenceCase, dict[str, np.ndarray]]],
                               dict[str, np.ndarray], list[str]]:
    """The real-photograph case at `resolution`: two shipped photographs resized and
    centre-cropped by the bundle's interpolation, stored as uint8, their input made as the
    bundle's preprocessing makes it. ([case], {name: pixels}, notes)."""
    from vit_deploy.data import data_path
    from vit_deploy.runtime.preprocess import Preprocess, load_image

    if channels != 3:
        return [], {}, [f"no real-photograph reference: the model takes {channels} channels"]
    pre = Preprocess(resolution=resolution, patch_size=patch_size, mean=preprocess.mean,
                     std=preprocess.std, resize="shorter_side_center_crop",
                     interpolation=preprocess.interpolation, scale=preprocess.scale)
    every = np.stack([pre.pixels(load_image(data_path(f"photos/{name}"))).transpose(2, 0, 1)
                      for name in REFERENCE_PHOTOS])
    stored = ReferencePixels(offset=0, mean=tuple(pre.mean), std=tuple(pre.std),
                             scale=float(pre.scale))
    notes = []
    for count in range(len(every), 0, -1):  # both photographs, else one rather than none
        pixels = every[:count]
        case = ReferenceCase(name=PHOTO_CASE, seed=0, shape=tuple(pixels.shape), outputs={},
                             pixels=stored)
        outputs = _named(forward(stored.input(pixels.tobytes(), pixels.shape)), output_names)
        size = sum(a.size * 4 for a in outputs.values())
        if used_bytes + size <= budget_bytes and pixels.size <= max(budget_bytes,
                                                                    PIXEL_ALLOWANCE):
            if count < len(every):
                notes.append(f"reference case {PHOTO_CASE} ({resolution[0]}x{resolution[1]}) "
                             f"holds {count} of the {len(every)} photographs: both would "
                             f"take the references to {used_bytes + 2 * size} bytes, over "
                             f"the bound of {budget_bytes} ({MAX_FRACTION:.0%} of the fp32 "
                             f"model)")
            return [(case, outputs)], {PHOTO_CASE: pixels}, notes
    return [], {}, [f"reference case {PHOTO_CASE} ({resolution[0]}x{resolution[1]}: outputs "
                    f"{size} bytes for one photograph, pixels {pixels.size}) left out: the "
                    f"references already hold {used_bytes} bytes, and the bound is "
                    f"{budget_bytes} bytes ({MAX_FRACTION:.0%} of the fp32 model) for all "
                    f"outputs, {max(budget_bytes, PIXEL_ALLOWANCE)} for pixels"]


def budget(model_bytes: int) -> int:
    return math.floor(MAX_FRACTION * model_bytes)


def write_references(cases: list[tuple[ReferenceCase, dict[str, np.ndarray]]], root,
                     file: str = REFERENCES_FILE,
                     pixels: Mapping[str, np.ndarray] | None = None) -> References:
    """Write the references file into `root` (a staging directory); its References."""
    refs, data = pack(cases, source=source(), file=file, pixels=pixels)
    (root / file).write_bytes(data)
    return refs
