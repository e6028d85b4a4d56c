"""The image towers of Hugging Face (CLIP, SigLIP / SigLIP 2, DINOv3): one reader, walking
the layers with a family's key map (TowerKeys) and leaving the tokens, positions and last
norms to the family (TowerKeys.tokens, on a Tower). Absent q/k/v, output and MLP biases are
zeros."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vit_deploy.export.checkpoints.describe import (_count, _describe, _indices, _mlp_ratio,
                                                    _numbered, _square)
from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.checkpoints.family import Family
from vit_deploy.export.checkpoints.hf_config import _HFConfig, _hf_normalisation, _hf_state
from vit_deploy.export.checkpoints.mapping import _build_mapped
from vit_deploy.export.model import ViT
from vit_deploy.runtime.config import ViTConfig

# What each tower's config.json `hidden_act` becomes (others are refused).
TOWER_ACTS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
              "silu": "silu", "swish": "silu"}
# The config fields a tower has unless its family says otherwise (Family.config).
TOWER_FIELDS = dict(class_token=False, pos_prefix_tokens=0, fc_norm=False, pool="mean",
                    pos_embed="learned", pos_interp="bicubic", pos_antialias=False,
                    pre_norm=False, proj_dim=0)


@dataclass
class Tower:
    """What a family's `tokens` reads (the file's tensors, config.json) and adds to: the
    mapping (`spec`: our key <- theirs; `convert`), the grid and register count it finds."""
    where: str
    get: _HFConfig
    state: dict[str, torch.Tensor]
    given: dict[str, torch.Tensor]  # the file's tensors (a family may drop an empty one)
    prefix: str  # "vision_model.", "model." or ""
    E: str  # prefix + "embeddings."
    patch: int
    spec: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    convert: dict[str, Any] = field(default_factory=dict)  # our key -> how theirs becomes ours
    grid: tuple[int, int] = (0, 0)
    regs: int = 0
    use_head: bool = False


@dataclass(frozen=True)
class TowerKeys:
    """A family's key map: its layers (the first prefix that the file holds, else the last),
    their parts, its patch embedding; then `tokens` maps the rest."""
    layers: tuple[str, ...]  # "encoder.layers." ; DINOv3 "layer.", else "model.layer."
    attention: str  # q_proj, k_proj, v_proj and `out` under it
    out: str
    mlp: tuple[str, str]  # -> mlp.fc1, mlp.fc2
    norms: tuple[str, str]  # -> norm1, norm2
    patch: str  # under embeddings.
    tokens: Callable[[Tower], None]  # class / register tokens, positions, last norms
    layer_scale: tuple[tuple[str, str], ...] = ()  # our block key <- theirs
    gate: str = ""  # with mlp[0], mlp.gate_fc1 when config.json says use_gated_mlp (DINOv3)
    patch_bias: bool = True
    map_head: bool = False  # an attention-pooling head (head.) when the file has one


def learned_table(t: Tower, class_rows: int) -> int:
    """The learned position table (embeddings.position_embedding, `class_rows` before a
    square grid) mapped; its side."""
    E, state, where = t.E, t.state, t.where
    pos = state.get(E + "position_embedding.weight")
    rows = pos.shape[0] if pos is not None and pos.dim() == 2 else -1
    side = math.isqrt(max(rows - class_rows, 0))
    if rows < 0 or not _square(rows - class_rows):
        raise CheckpointError(f"{where}: {E}position_embedding.weight "
                              f"{'is missing' if pos is None else f'has shape {tuple(pos.shape)}'}"
                              f"; it must hold {'1 + ' if class_rows else ''}a square grid of rows")
    t.grid = (side, side)
    t.spec.append(("pos.pos_embed", (E + "position_embedding.weight",)))
    t.convert["pos.pos_embed"] = lambda x: x[None]
    return side


def load_tower(directory: Path, kind: str, hf: dict[str, Any], family: Family) -> ViT:
    """CLIPVisionModel(WithProjection), SiglipVisionModel, Siglip2VisionModel, DINOv3ViTModel
    (config.json already read: `hf`)."""
    where, config_path = str(directory), directory / "config.json"
    keys: TowerKeys = family.keys
    get = _HFConfig(hf, config_path)
    width, depth = get.int("hidden_size"), get.int("num_hidden_layers")
    heads, patch = get.int("num_attention_heads"), get.pair("patch_size")
    in_chans, hidden = get.int("num_channels", 3), get.int("intermediate_size")
    norm_eps = get.number("layer_norm_eps")
    act, gated = hf.get("hidden_act", "gelu"), get.bool("use_gated_mlp", False)
    if not isinstance(act, str) or act not in TOWER_ACTS:
        raise CheckpointError(f"{where}: hidden_act must be one of {sorted(TOWER_ACTS)}, the "
                              f"checkpoint uses {act!r}" + (" in a gated MLP" if gated else ""))
    if gated and not keys.gate:
        raise CheckpointError(f"{where}: use_gated_mlp is read for DINOv3 only, not {kind}")
    if width % heads:
        raise CheckpointError(f"{str(config_path)!r}: num_attention_heads {heads} does not "
                              f"divide hidden_size {width}")
    state = _hf_state(directory, where)
    prefix = next((p for p in ("vision_model.", "model.") if any(
        k.startswith(p + "embeddings.") for k in state)), "")
    E = prefix + "embeddings."
    L = prefix + keys.layers[0]
    for other in keys.layers[1:]:
        if not any(k.startswith(L) for k in state):
            L = prefix + other
    layers = _indices(state, L)
    if not _numbered(layers, depth):
        raise CheckpointError(f"{where}: config.json says num_hidden_layers {depth}, its weights "
                              f"hold {_count(len(layers), 'layer')} ({_describe(L, layers)})")
    given = dict(state)  # the file's tensors; `state` gains the zeros of absent biases
    tower = Tower(where, get, state, given, prefix, E, patch)
    spec, convert = tower.spec, tower.convert

    def bias(key: str, rows: int) -> str:
        if key not in state:
            state[key] = torch.zeros(rows)
        return key

    for i in layers:
        b, o = f"{L}{i}.", f"blocks.{i}."
        att = b + keys.attention
        qkv = tuple(att + f"{n}_proj" for n in "qkv")
        spec.append((o + "attn.qkv.weight", tuple(q + ".weight" for q in qkv)))
        if any(q + ".bias" in state for q in qkv):
            spec.append((o + "attn.qkv.bias", tuple(bias(q + ".bias", width) for q in qkv)))
        out = att + keys.out
        spec += [(o + "attn.proj.weight", (out + ".weight",)),
                 (o + "attn.proj.bias", (bias(out + ".bias", width),))]
        fc1, fc2 = b + keys.mlp[0], b + keys.mlp[1]
        up = (b + keys.gate, fc1) if gated else (fc1,)  # gated: [gate; up] (export/mlp.py)
        spec += [(o + ("mlp.gate_fc1" if gated else "mlp.fc1") + ".weight",
                  tuple(t + ".weight" for t in up)),
                 (o + ("mlp.gate_fc1" if gated else "mlp.fc1") + ".bias",
                  tuple(bias(t + ".bias", hidden) for t in up)),
                 (o + "mlp.fc2.weight", (fc2 + ".weight",)),
                 (o + "mlp.fc2.bias", (bias(fc2 + ".bias", width),))]
        spec += [(o + f"norm{n}.{p}", (b + f"{theirs}.{p}",))
                 for n, theirs in enumerate(keys.norms, start=1) for p in ("weight", "bias")]
        spec += [(o + mine, (b + theirs,)) for mine, theirs in keys.layer_scale]
    patch_key = E + keys.patch
    spec.append(("patch_embed.proj.weight", (patch_key + ".weight",)))
    if keys.patch_bias:
        spec.append(("patch_embed.proj.bias", (patch_key + ".bias",)))
    keys.tokens(tower)
    tower.use_head = keys.map_head and any(k.startswith(prefix + "head.") for k in state)
    if tower.use_head:  # nn.MultiheadAttention's packed in_proj: q, then k and v
        h = prefix + "head."
        spec += [("map_head.probe", (h + "probe",)),
                 ("map_head.proj.weight", (h + "attention.out_proj.weight",)),
                 ("map_head.proj.bias", (h + "attention.out_proj.bias",))]
        spec += [(f"map_head.{m}.{p}", (h + f"{t}.{p}",)) for m, t in (
            ("norm", "layernorm"), ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2"))
            for p in ("weight", "bias")]
        for mine, part in (("q", slice(0, width)), ("kv", slice(width, None))):
            for p in ("weight", "bias"):
                spec.append((f"map_head.{mine}.{p}", (h + f"attention.in_proj_{p}",)))
                convert[f"map_head.{mine}.{p}"] = lambda t, part=part: t[part]
    mean, std = _hf_normalisation(directory, in_chans, family.normalisation)
    fields = {**TOWER_FIELDS, **family.config(tower)}
    try:
        cfg = ViTConfig(
            img_size=(tower.grid[0] * patch, tower.grid[1] * patch), patch_size=patch,
            in_chans=in_chans, width=width, depth=depth, heads=heads,
            mlp_ratio=_mlp_ratio(hidden, width), num_classes=0,
            qkv_bias=any(k.endswith("attn.qkv.bias") for k, _ in spec), norm_eps=norm_eps,
            num_registers=tower.regs, layer_scale=bool(keys.layer_scale), act=TOWER_ACTS[act],
            mlp="gated" if gated else "plain",
            patch_bias=keys.patch_bias, rope_theta=get.number("rope_theta", 100.0), mean=mean,
            std=std, name=f"hf-{kind.removesuffix('_vision_model').removesuffix('_vit')}",
            **fields)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: config.json and its weights give no valid config: "
                              f"{e}") from None
    return _build_mapped(cfg, state, given, spec, convert, where=where, kind=kind, prefix=prefix)
