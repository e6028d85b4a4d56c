"""Golden references at export (and per target bucket): PyTorch fp32 outputs for inputs
regenerated from a seed (runtime/references.py reads them, torch-free)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.references import (MAX_FRACTION, REFERENCE_BATCH, REFERENCES_FILE,
                                           ReferenceCase, References, mulberry32_uniform, pack)

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


def budget(model_bytes: int) -> int:
    return math.floor(MAX_FRACTION * model_bytes)


def write_references(cases: list[tuple[ReferenceCase, dict[str, np.ndarray]]], root,
                     file: str = REFERENCES_FILE) -> References:
    """Write the references file into `root` (a staging directory); its References."""
    refs, data = pack(cases, source=source(), file=file)
    (root / file).write_bytes(data)
    return refs
