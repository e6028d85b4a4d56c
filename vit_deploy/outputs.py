"""Which tensors a bundle outputs, and their shapes (torch-free: the exporter, the manifest
and every tool that reads a bundle ask this one module).

A classifier outputs `logits` (and `pooled` with --features); a backbone (no classifier)
outputs `pooled` and `patch_tokens`. Dense outputs are laid out on the patch grid,
(batch, width, grid_height, grid_width), ready for a convolutional or upsampling head.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import (BATCH_DIM, CLASS_TOKEN_NAME, FEATURES_NAME, GRID_H_DIM,
                                 GRID_W_DIM, LAYER_PREFIX, LOGITS_NAME, OUTPUT_KINDS,
                                 PATCH_TOKENS_NAME, REGISTERS_NAME, layer_output)

GRID_OUTPUTS = (PATCH_TOKENS_NAME,)  # plus every layer_N


@dataclass(frozen=True, kw_only=True)
class OutputSelection:
    """The graph's outputs, in order, and how intermediate layers are normalised."""

    names: tuple[str, ...]
    layer_norm: bool = True  # layer_N through the final norm (DINOv2 / Dinov2Backbone)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(b for b in map(block_of, self.names) if b is not None)

    @property
    def default_only(self) -> bool:
        """Just the logits (or just the pooled vector of a backbone): the classic graph."""
        return self.names in ((LOGITS_NAME,), (FEATURES_NAME,))


def block_of(name: str) -> int | None:
    """layer_3 -> 3; any other name -> None."""
    if name.startswith(LAYER_PREFIX) and name[len(LAYER_PREFIX):].isdigit():
        return int(name[len(LAYER_PREFIX):])
    return None


def is_grid_output(name: str) -> bool:
    return name in GRID_OUTPUTS or block_of(name) is not None


def default_outputs(cfg: ViTConfig, *, features: bool = False) -> tuple[str, ...]:
    if not cfg.num_classes:  # a backbone: what people deploy one for
        return (FEATURES_NAME,) if cfg.merging else (FEATURES_NAME, PATCH_TOKENS_NAME)
    return (LOGITS_NAME, FEATURES_NAME) if features else (LOGITS_NAME,)


def select_outputs(cfg: ViTConfig, requested: Sequence[str] | None = None, *,
                   layers: Iterable[int] = (), features: bool = False,
                   layer_norm: bool = True) -> OutputSelection:
    """The outputs asked for, checked against what the model has; ValueError naming the
    choices otherwise. `requested` None: the defaults for the model (see module doc)."""
    names = list(requested) if requested else list(default_outputs(cfg, features=features))
    if requested and features and FEATURES_NAME not in names:
        names.append(FEATURES_NAME)
    unknown = [n for n in names if n not in OUTPUT_KINDS]
    if unknown:
        raise ValueError(f"unknown output(s) {unknown}; choose from {list(OUTPUT_KINDS)} "
                         f"(and --layers for intermediate blocks)")
    missing = {LOGITS_NAME: (not cfg.num_classes, "it has no classifier (num_classes 0)"),
               CLASS_TOKEN_NAME: (not cfg.class_token, "it has no class token"),
               REGISTERS_NAME: (not cfg.num_registers, "it has no register tokens")}
    for name in names:
        absent, why = missing.get(name, (False, ""))
        if absent:
            raise ValueError(f"output {name!r} asked for, but {why}")
    layers = list(layers)
    bad = [b for b in layers if not isinstance(b, int) or not 1 <= b <= cfg.depth]
    if bad:
        raise ValueError(f"layers must be block numbers 1..{cfg.depth} (the model has "
                         f"{cfg.depth} blocks), got {bad}")
    names += [layer_output(b) for b in layers]
    if cfg.merging and any(is_grid_output(n) for n in names):
        raise ValueError(f"{[n for n in names if is_grid_output(n)]} are laid out on the patch "
                         f"grid, which token merging (merge {list(cfg.merge)}) does not keep; "
                         f"export them without --merge-tokens")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"output(s) {dupes} asked for twice")
    return OutputSelection(names=tuple(names), layer_norm=layer_norm)


def output_shape(cfg: ViTConfig, name: str,
                 resolution: tuple[int, int] | None = None) -> tuple[int | str, ...]:
    """The shape of output `name`: symbolic grid dims, or fixed ones for a static
    `resolution`."""
    D = cfg.width
    if resolution is None:
        grid: tuple[int | str, int | str] = (GRID_H_DIM, GRID_W_DIM)
    else:
        grid = (resolution[0] // cfg.patch_size, resolution[1] // cfg.patch_size)
    if name == LOGITS_NAME:
        return (BATCH_DIM, cfg.num_classes)
    if name == FEATURES_NAME:
        return (BATCH_DIM, cfg.pooled_dim)
    if name == CLASS_TOKEN_NAME:
        return (BATCH_DIM, D)
    if name == REGISTERS_NAME:
        return (BATCH_DIM, cfg.num_registers, D)
    if is_grid_output(name):
        return (BATCH_DIM, D, *grid)
    raise ValueError(f"unknown output {name!r}")


def parse_names(text: str | None) -> tuple[str, ...] | None:
    """'logits,patch_tokens' -> ('logits', 'patch_tokens'); None or '' -> None."""
    if not text:
        return None
    return tuple(p.strip() for p in text.split(",") if p.strip()) or None


def parse_layers(text: str | None) -> tuple[int, ...]:
    """'3,6,9,12' -> (3, 6, 9, 12); ValueError for anything that is not block numbers."""
    if not text:
        return ()
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"layers must be comma-separated block numbers like 3,6,9,12, "
                         f"got {text!r}")
    return tuple(int(p) for p in parts)


def write_features(session: Any, images: Sequence[Any], preprocess: Any,
                   path: str | Path) -> dict[str, Any]:
    """Each image's dense outputs (patch_tokens, layer_N) as `<output>_<index>` arrays of
    (width, grid_h, grid_w), image by image so each keeps its aspect ratio, in one .npz
    written atomically, with the image names as `sources`. Returns {file, shapes}."""
    import io

    import numpy as np

    from vit_deploy.runtime.files import write_bytes_atomic
    from vit_deploy.runtime.results import require_finite

    names = [n for n in session.output_names if is_grid_output(n)]
    if not names:
        raise ValueError(f"the bundle has no dense outputs (outputs: {session.output_names}); "
                         f"export with --outputs patch_tokens or --layers")
    arrays: dict[str, Any] = {"sources": np.array([str(i) for i in images])}
    for i, image in enumerate(images):
        outs = session.run_all(preprocess(image)[None])
        arrays.update({f"{n}_{i}": require_finite(outs[n], n)[0] for n in names})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomic(Path(path), buffer.getvalue())
    return {"file": str(path), "shapes": {k: list(v.shape) for k, v in arrays.items()
                                          if k != "sources"}}
