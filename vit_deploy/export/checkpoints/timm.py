"""timm VisionTransformer / DeiT / DeiT-3 state dicts: our layout but for one key, the config
read from the tensors alone (timm resamples positions bicubic with antialias)."""

from __future__ import annotations

import math

import torch

from vit_deploy.export.checkpoints.describe import (_count, _describe, _indices, _mlp_ratio,
                                                    _numbered, _square)
from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.checkpoints.layout import _build_checked
from vit_deploy.export.model import ViT
from vit_deploy.runtime.config import ViTConfig

# timm does not store the head count; these are the standard widths (ViT / DeiT / DINOv2).
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16, 1536: 24}
# timm's key -> ours, where they differ.
KEY_MAP = {"pos_embed": "pos.pos_embed"}


def is_timm_state(state: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict has timm's layout (its patch embedding and position table)."""
    return "patch_embed.proj.weight" in state and "pos_embed" in state


def timm_config(state: dict[str, torch.Tensor], *, heads: int | None = None,
                source: str = "the timm checkpoint") -> ViTConfig:
    """Infer a config from a timm VisionTransformer / DeiT / DeiT-3 state dict.

    Only the tensors say what the model is, so they must agree with each other: the blocks
    numbered 0..N-1, a square patch, a position table whose rows are prefix + a square grid."""
    def need(key: str, dims: int) -> torch.Tensor:
        t = state.get(key)
        if t is None:
            raise CheckpointError(f"{source} is not a timm ViT state dict: {key} is missing")
        if t.dim() != dims:
            raise CheckpointError(f"{source}: {key} has shape {tuple(t.shape)}; a timm ViT's "
                                  f"is {dims}-D")
        return t

    width, in_chans, patch, patch_w = need("patch_embed.proj.weight", 4).shape
    if patch != patch_w:
        raise CheckpointError(f"{source}: patch_embed.proj.weight cuts {patch}x{patch_w} "
                              f"patches; only square patches are supported")
    blocks = _indices(state, "blocks.")
    if not blocks:
        raise CheckpointError(f"{source} is not a timm ViT state dict: it has no blocks.N. keys")
    if not _numbered(blocks, len(blocks)):
        raise CheckpointError(f"{source}: its highest block index says depth {blocks[-1] + 1}, "
                              f"its weights hold {_count(len(blocks), 'block')} "
                              f"({_describe('blocks.', blocks)})")
    hidden = need("blocks.0.mlp.fc1.weight", 2).shape[0]
    pos = need("pos_embed", 3).shape[1]
    cls, dist = "cls_token" in state, "dist_token" in state
    regs = need("reg_token", 3).shape[1] if "reg_token" in state else 0
    prefix = int(cls) + int(dist) + regs
    k = prefix if _square(pos - prefix) else 0 if _square(pos) else None  # no_embed_class: 0
    if k is None:
        raise CheckpointError(
            f"{source}: pos_embed has {pos} rows; its prefix tokens (cls {int(cls)}, dist "
            f"{int(dist)}, registers {regs}) leave {pos - prefix} rows, and neither {pos - prefix} "
            f"nor {pos} is a square grid")
    grid = math.isqrt(pos - k)
    heads = heads or HEADS_BY_WIDTH.get(width)
    if heads is None:
        raise CheckpointError(f"timm checkpoints do not store the head count; width {width} is "
                              f"not a standard one: pass --heads")
    fc_norm = "fc_norm.weight" in state
    num_classes = need("head.weight", 2).shape[0] if "head.weight" in state else 0
    try:
        return ViTConfig(img_size=(grid * patch, grid * patch), patch_size=patch,
                         in_chans=in_chans, width=width, depth=len(blocks), heads=heads,
                         mlp_ratio=_mlp_ratio(hidden, width), num_classes=num_classes,
                         qkv_bias="blocks.0.attn.qkv.bias" in state, class_token=cls,
                         dist_token=dist, dist_head="head_dist.weight" in state,
                         num_registers=regs, pos_prefix_tokens=k,
                         layer_scale="blocks.0.ls1.gamma" in state, fc_norm=fc_norm,
                         pool="mean" if fc_norm or not cls else "cls",
                         pos_interp="bicubic", pos_antialias=True, name="timm")
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{source}: its tensors (width {width}, {in_chans} channels, "
                              f"patch {patch}, {heads} heads) give no valid config: {e}") from None


def load_timm(state: dict[str, torch.Tensor], *, source: str, heads: int | None = None) -> ViT:
    cfg = timm_config(state, heads=heads, source=source)
    mapped = {KEY_MAP.get(k, k): v for k, v in state.items()}
    return _build_checked(cfg, mapped, source=source, said="the config read from its tensors says")
