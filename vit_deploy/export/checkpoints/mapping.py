"""Their keys onto ours: a mapping (`spec`: our key <- the file's keys, concatenated) checked
against the file, both ways (every tensor needed is there, every tensor there is used or
known not to matter), then applied and the model built."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from vit_deploy.export.checkpoints.describe import _some
from vit_deploy.export.checkpoints.errors import CheckpointError, CheckpointWarning
from vit_deploy.export.checkpoints.layout import _expected_shapes, load_state
from vit_deploy.export.model import ViT, build_model
from vit_deploy.runtime.config import ViTConfig

# Tensors a Hugging Face checkpoint may carry that do not change the features we export:
# ViTModel's pooler (dense + tanh on the class token, not part of last_hidden_state), the
# masked-image-modelling token (used only with bool_masked_pos), a dual encoder's text tower
# and its logit scale / bias (CLIPModel, SiglipModel, Siglip2Model: the image tower is what
# is exported), and the position_ids buffer older transformers saved.
HF_IRRELEVANT = (re.compile(r"pooler\."), re.compile(r"embeddings\.mask_token$"),
                 re.compile(r"text_model\."), re.compile(r"text_projection\."),
                 re.compile(r"logit_(scale|bias)$"), re.compile(r"embeddings\.position_ids$"))


def _check_mapping(spec: list[tuple[str, tuple[str, ...]]], have: Mapping[str, Any],
                   given: Iterable[str], *, prefix: str, where: str, kind: str,
                   needs: str) -> list[str]:
    """Every tensor the mapping (`spec`: our key <- theirs) needs is in `have`, and every
    tensor of the file (`given`) is used or irrelevant (HF_IRRELEVANT); else one
    CheckpointError naming both. Returns the irrelevant ones (the caller warns)."""
    used = {t for _, theirs in spec for t in theirs}
    missing = [t for _, theirs in spec for t in theirs if t not in have]
    unused = sorted(set(given) - used)
    ignored = [k for k in unused if any(p.match(k.removeprefix(prefix)) for p in HF_IRRELEVANT)]
    unknown = [k for k in unused if k not in ignored]
    problems = []
    if missing:
        problems.append(f"{needs} needs tensors its weights lack: {_some(missing)}")
    if unknown:
        problems.append(f"its weights hold tensors the {kind} mapping does not use: "
                        f"{_some(unknown)}")
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems))
    return ignored


def _build_mapped(cfg: ViTConfig, state: dict[str, torch.Tensor], given: dict[str, Any],
                  spec: list[tuple[str, tuple[str, ...]]], convert: dict[str, Any], *,
                  where: str, kind: str, prefix: str) -> ViT:
    """Our state from the file's tensors (`spec`: our key <- theirs, concatenated; then
    `convert`), checked: every tensor the mapping needs is there, every tensor of the file
    (`given`) is used or irrelevant (HF_IRRELEVANT: warned), every shape is the model's."""
    ignored = _check_mapping(spec, state, given, prefix=prefix, where=where, kind=kind,
                             needs=f"config.json ({kind}, {cfg.depth} layers)")
    ours = {}
    for mine, theirs in spec:
        t = _joined(state, theirs, where=where, mine=mine)
        ours[mine] = convert[mine](t) if mine in convert else t
    shapes = _expected_shapes(cfg, blocks=cfg.depth) or {}
    wrong = [f"{mine} (from {', '.join(theirs)}): checkpoint {tuple(ours[mine].shape)} vs "
             f"expected {shapes[mine]}" for mine, theirs in spec
             if mine in shapes and tuple(ours[mine].shape) != shapes[mine]]
    if wrong:
        raise CheckpointError(f"{where}: its weights do not match config.json: shape mismatch: "
                              f"{_some(wrong)}")
    return _built(cfg, ours, where=where, ignored=ignored, stacklevel=4)


def _joined(state: dict[str, torch.Tensor], theirs: Sequence[str], *,
            where: str = "the checkpoint", mine: str = "one tensor") -> torch.Tensor:
    """Our one tensor (`mine`) from their one or several, concatenated along the first
    dimension (separate q, k, v; a gated MLP's gate and up): a CheckpointError naming every
    shape when the others do not agree."""
    parts = [state[t] for t in theirs]
    if len(parts) == 1:
        return parts[0]
    if any(p.dim() == 0 for p in parts) or len({tuple(p.shape[1:]) for p in parts}) > 1:
        raise CheckpointError(f"{where}: {mine} is {', '.join(theirs)} stacked, so they must "
                              f"agree on every dimension but the first; their shapes are "
                              f"{', '.join(str(tuple(p.shape)) for p in parts)}")
    return torch.cat(parts)


def _built(cfg: ViTConfig, ours: dict[str, torch.Tensor], *, where: str, ignored: Sequence[str],
           stacklevel: int) -> ViT:
    """The model `cfg` builds with the weights `ours`; a CheckpointWarning names the
    checkpoint's tensors that were not used (at the caller's caller: `stacklevel`)."""
    model = build_model(cfg, seed=None)
    load_state(model, ours, source=where)
    if ignored:
        warnings.warn(CheckpointWarning.unused(where, tuple(ignored)), stacklevel=stacklevel)
    return model
