"""Our layout checked: what a config says against what the tensors hold, one sentence per
field, before anything is built (_build_checked); the keys and shapes the model expects
(_expected_shapes, on the meta device); the state loaded into the model (load_state)."""

from __future__ import annotations

import torch

from vit_deploy.export.checkpoints.describe import (_and_more, _count, _describe, _indices,
                                                    _numbered, _some)
from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.model import ViT, build_model
from vit_deploy.runtime.config import ViTConfig


def load_state(model: ViT, state: dict[str, torch.Tensor], *, source: str) -> None:
    own = model.state_dict()
    problems = _layout_problems({k: tuple(v.shape) for k, v in own.items()}, state)
    if problems:
        raise CheckpointError(f"{source} does not match the model layout: " + "; ".join(problems))
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


def _layout_problems(own: dict[str, tuple[int, ...]], state: dict[str, torch.Tensor]) -> list[str]:
    """Missing, unexpected and shape-mismatched keys (at most 5 of each shown)."""
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {own[k]}"
              for k in sorted(set(own) & set(state)) if tuple(state[k].shape) != own[k]]
    return [f"{label} keys: {_some(items)}" for label, items in
            (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)) if items]


def _build_checked(cfg: ViTConfig, state: dict[str, torch.Tensor], *, source: str,
                   said: str) -> ViT:
    """Build `cfg` and load `state` into it, or say how the two disagree: first what the
    config says against what the tensors hold, then the keys. The comparison comes before
    anything is allocated, so a config that lies about its size builds nothing."""
    explained = _disagreements(cfg, state, said)
    shapes = _expected_shapes(cfg, blocks=len(_indices(state, "blocks.")))
    listed = _layout_problems(shapes, state) if shapes is not None else []
    if explained:
        detail = f"; it does not match the model layout: {'; '.join(listed)}" if listed else ""
        raise CheckpointError(f"{source}: " + "; ".join(explained) + detail)
    if listed or shapes is None:
        raise CheckpointError(f"{source} does not match the model layout: "
                              + ("; ".join(listed) or "its config builds no model"))
    model = build_model(cfg, seed=None)
    load_state(model, state, source=source)
    return model


def _expected_shapes(cfg: ViTConfig, *, blocks: int) -> dict[str, tuple[int, ...]] | None:
    """Key -> shape of the model `cfg` builds, without allocating it (meta device); None when
    the config is too large to describe (a depth far beyond the weights, sizes that overflow)."""
    if cfg.depth > 2 * blocks + 16:
        return None
    try:
        with torch.device("meta"):
            model = build_model(cfg, seed=None)
    except (RuntimeError, ValueError, OverflowError, MemoryError):
        return None
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _disagreements(cfg: ViTConfig, state: dict[str, torch.Tensor], said: str) -> list[str]:
    """What `cfg` says against what the tensors (our layout) hold, one sentence per field."""
    out: list[str] = []
    blocks = _indices(state, "blocks.")
    if not _numbered(blocks, cfg.depth):
        out.append(f"{said} depth {cfg.depth}, its weights hold {_count(len(blocks), 'block')} "
                   f"({_describe('blocks.', blocks)})")
    width_ok = True
    pe = state.get("patch_embed.proj.weight")
    if pe is not None:
        s = tuple(pe.shape)
        if len(s) != 4:
            width_ok = False
            out.append(f"patch_embed.proj.weight has shape {s}; a patch embedding is 4-D "
                       f"(width {cfg.width}, channels {cfg.in_chans}, patch {cfg.patch_size}, "
                       f"patch {cfg.patch_size})")
        else:
            if s[0] != cfg.width:
                width_ok = False
                out.append(f"{said} width {cfg.width}, its weights are {s[0]} wide "
                           f"(patch_embed.proj.weight {s})")
            if s[1] != cfg.in_chans:
                out.append(f"{said} in_chans {cfg.in_chans}, its patch embedding takes {s[1]} "
                           f"channels (patch_embed.proj.weight {s})")
            if s[2:] != (cfg.patch_size, cfg.patch_size):
                out.append(f"{said} patch_size {cfg.patch_size}, its patch embedding cuts "
                           f"{s[2]}x{s[3]} patches (patch_embed.proj.weight {s})")
    if width_ok:
        w, hidden = cfg.width, int(cfg.width * cfg.mlp_ratio)
        qkv = [(i, tuple(t.shape)) for i in blocks
               if (t := state.get(f"blocks.{i}.attn.qkv.weight")) is not None
               and tuple(t.shape) != (3 * w, w)]
        if qkv:
            out.append(f"{said} width {w}, so each blocks.N.attn.qkv.weight is ({3 * w}, {w}) "
                       f"(query, key, value); its blocks.{qkv[0][0]}.attn.qkv.weight is "
                       f"{qkv[0][1]}{_and_more(qkv)}")
        mlp = [(i, tuple(t.shape)) for i in blocks
               if (t := state.get(f"blocks.{i}.mlp.fc1.weight")) is not None
               and (t.shape[0] if t.dim() else 0) != hidden]
        if mlp:
            i, s = mlp[0]
            out.append(f"{said} mlp_ratio {cfg.mlp_ratio} (an MLP {hidden} wide at width {w}), "
                       f"its weights' MLP is {s[0] if s else 0} wide "
                       f"(blocks.{i}.mlp.fc1.weight {s}){_and_more(mlp)}")
    head = state.get("head.weight")
    rows = (head.shape[0] if head.dim() else -1) if head is not None else 0
    if rows != cfg.num_classes:
        if head is None:
            out.append(f"{said} num_classes {cfg.num_classes}, its weights have no "
                       f"classification head (no head.weight)")
        else:
            out.append(f"{said} num_classes {cfg.num_classes}, its head.weight has shape "
                       f"{tuple(head.shape)} ({rows} classes)")
    for field, key in (("class_token", "cls_token"), ("dist_token", "dist_token"),
                       ("fc_norm", "fc_norm.weight"),
                       ("qkv_bias", f"blocks.{blocks[0] if blocks else 0}.attn.qkv.bias"),
                       ("layer_scale", f"blocks.{blocks[0] if blocks else 0}.ls1.gamma")):
        if field in ("qkv_bias", "layer_scale") and not blocks:
            continue
        if getattr(cfg, field) != (key in state):
            out.append(f"{said} {field} {getattr(cfg, field)}, its weights "
                       f"{'have' if key in state else 'have no'} {key}")
    reg = state.get("reg_token")
    regs = 0 if reg is None else reg.shape[1] if reg.dim() == 3 else -1
    if regs != cfg.num_registers:
        out.append(f"{said} num_registers {cfg.num_registers}, its weights hold "
                   + (f"reg_token {tuple(reg.shape)}" if reg is not None else "no reg_token"))
    if cfg.dist_token and cfg.num_classes and "dist_token" in state \
            and cfg.dist_head != ("head_dist.weight" in state):
        out.append(f"{said} dist_head {cfg.dist_head}, its weights "
                   f"{'have' if 'head_dist.weight' in state else 'have no'} head_dist.weight")
    out += _position_disagreements(cfg, state, said)
    return out


def _position_disagreements(cfg: ViTConfig, state: dict[str, torch.Tensor], said: str) -> list[str]:
    (gh, gw), k = cfg.grid_size, cfg.num_pos_prefix
    grid = (f"img_size {cfg.img_size[0]}x{cfg.img_size[1]} at patch {cfg.patch_size} "
            f"(grid {gh}x{gw})")
    learned, factorized = "pos.pos_embed" in state, "pos.pos_row" in state
    if cfg.pos_embed == "learned" and factorized and not learned:
        return [f"{said} pos_embed 'learned', its weights hold a factorized table (pos.pos_row)"]
    if cfg.pos_embed == "factorized" and learned and not factorized:
        return [f"{said} pos_embed 'factorized', its weights hold a learned table (pos.pos_embed)"]
    out = []
    if cfg.pos_embed == "learned" and learned:
        t = state["pos.pos_embed"]
        rows = t.shape[1] if t.dim() == 3 else None
        if rows != k + gh * gw:
            out.append(f"{said} {grid} and {_count(k, 'prefix row')}: {k + gh * gw} position "
                       f"rows; its pos.pos_embed has shape {tuple(t.shape)}")
    elif cfg.pos_embed == "factorized":
        for key, n, what in (("pos.pos_row", gh, f"{grid}: {gh} rows"),
                             ("pos.pos_col", gw, f"{grid}: {gw} columns"),
                             ("pos.pos_prefix", k, f"{k} prefix tokens with a position")):
            t = state.get(key)
            if t is not None and (t.shape[1] if t.dim() == 3 else None) != n:
                out.append(f"{said} {what}; its {key} has shape {tuple(t.shape)}")
    return out
