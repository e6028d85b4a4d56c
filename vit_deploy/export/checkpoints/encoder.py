"""The ViTModel-style encoders of Hugging Face (ViT, DeiT, DINOv2 ± registers): one reader,
walking encoder.layer.N with a family's key map (EncoderKeys). What the tensors hold is
compared with what config.json says before anything is built."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_deploy.export.checkpoints.describe import (_count, _describe, _indices, _mlp_ratio,
                                                    _numbered, _some, _square)
from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.checkpoints.family import Family
from vit_deploy.export.checkpoints.hf_config import _HFConfig, _hf_normalisation, _hf_state
from vit_deploy.export.checkpoints.layout import _expected_shapes
from vit_deploy.export.checkpoints.mapping import _built, _check_mapping, _joined
from vit_deploy.export.model import ViT
from vit_deploy.runtime.config import ViTConfig

HF_PREFIXES = ("vit.", "deit.", "dinov2_with_registers.", "dinov2.")


@dataclass(frozen=True)
class EncoderKeys:
    """A family's key map inside encoder.layer.N: our block key <- theirs (norm1, norm2,
    mlp.fc1, mlp.fc2), and the layer-scale keys (ours <- theirs) it has besides."""
    names: Mapping[str, str]
    layer_scale: tuple[tuple[str, str], ...] = ()


def load_encoder(directory: Path, kind: str, hf: dict[str, Any], family: Family) -> ViT:
    """A ViTModel-style directory (config.json already read: `hf`), with or without a
    classification head."""
    where, config_path = str(directory), directory / "config.json"
    act, swiglu = hf.get("hidden_act", "gelu"), hf.get("use_swiglu_ffn", False)
    if act != "gelu" or swiglu:
        raise CheckpointError(f"only GELU MLPs are supported, the checkpoint uses "
                              f"{act!r}{' / SwiGLU' if swiglu else ''}")
    get = _HFConfig(hf, config_path)
    width, depth = get.int("hidden_size"), get.int("num_hidden_layers")
    heads, patch = get.int("num_attention_heads"), get.pair("patch_size")
    in_chans = get.int("num_channels", 3)
    image_size = get.pair("image_size", None)
    intermediate = get.int("intermediate_size", None)
    mlp_ratio = get.number("mlp_ratio", 4.0)
    qkv_bias = get.bool("qkv_bias", True)
    norm_eps = get.number("layer_norm_eps")
    registers = get.int("num_register_tokens", None, minimum=0)
    if width % heads:
        raise CheckpointError(f"{str(config_path)!r}: num_attention_heads {heads} does not "
                              f"divide hidden_size {width}")

    state = _hf_state(directory, where)
    prefix = next((p for p in HF_PREFIXES if any(k.startswith(p) for k in state)), "")
    body = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    heads_out = {k: v for k, v in state.items() if not k.startswith(prefix)} if prefix else {}
    E, L = prefix + "embeddings.", prefix + "encoder.layer."
    keys: EncoderKeys = family.keys

    # What the tensors hold, against what config.json says (before anything is built).
    said, told = "config.json says", []
    layers = _indices(body, "encoder.layer.")
    if not _numbered(layers, depth):
        told.append(f"{said} num_hidden_layers {depth}, its weights hold "
                    f"{_count(len(layers), 'layer')} ({_describe(L, layers)})")
    pe = state.get(E + "patch_embeddings.projection.weight")
    if pe is not None and pe.dim() != 4:
        told.append(f"{E}patch_embeddings.projection.weight has shape {tuple(pe.shape)}; a "
                    f"patch embedding is 4-D (hidden_size, channels, patch, patch)")
    elif pe is not None:
        s = tuple(pe.shape)
        if s[0] != width:
            told.append(f"{said} hidden_size {width}, its weights are {s[0]} wide "
                        f"({E}patch_embeddings.projection.weight {s})")
        if s[1] != in_chans:
            told.append(f"{said} num_channels {in_chans}, its patch embedding takes {s[1]} "
                        f"channels ({E}patch_embeddings.projection.weight {s})")
        if s[2:] != (patch, patch):
            told.append(f"{said} patch_size {patch}, its patch embedding cuts {s[2]}x{s[3]} "
                        f"patches ({E}patch_embeddings.projection.weight {s})")
    hidden = intermediate if intermediate is not None else int(width * mlp_ratio)
    fc1 = keys.names["mlp.fc1"] + ".weight"
    for i in layers[:1]:
        t = state.get(f"{L}{i}.{fc1}")
        if t is not None and t.dim() and t.shape[0] != hidden:
            setting = (f"intermediate_size {intermediate}" if intermediate is not None
                       else f"mlp_ratio {mlp_ratio} (an MLP {hidden} wide)")
            told.append(f"{said} {setting}, its weights' MLP is {t.shape[0]} wide "
                        f"({L}{i}.{fc1} {tuple(t.shape)})")
    dist = E + "distillation_token" in state
    reg = state.get(E + "register_tokens")
    regs = 0 if reg is None else reg.shape[1] if reg.dim() == 3 else -1
    if regs < 0:
        told.append(f"{E}register_tokens has shape {tuple(reg.shape)}; register tokens are "
                    f"3-D (1, registers, hidden_size)")
    elif registers is not None and registers != regs:
        told.append(f"{said} num_register_tokens {registers}, its weights hold "
                    f"{_count(regs, 'register token')}"
                    + (f" ({E}register_tokens {tuple(reg.shape)})" if reg is not None else ""))
    pos = state.get(E + "position_embeddings")
    grid = 0
    if pos is not None:
        rows, k = (pos.shape[1] if pos.dim() == 3 else -1), 1 + int(dist)
        if not _square(rows - k):
            told.append(f"{E}position_embeddings has shape {tuple(pos.shape)}: {rows} rows less "
                        f"{_count(k, 'prefix row')} is no square grid of patches")
        else:
            grid = math.isqrt(rows - k)
            if image_size is not None:
                gh, gw = image_size[0] // patch, image_size[1] // patch
                if (gh, gw) != (grid, grid):
                    told.append(f"{said} image_size {list(image_size)} at patch_size {patch} "
                                f"(grid {gh}x{gw}, {k + gh * gw} position rows), its "
                                f"{E}position_embeddings holds {rows} rows (grid {grid}x{grid})")
    if told:
        raise CheckpointError(f"{where}: " + "; ".join(told))

    classifier = next((c for c in ("classifier", "cls_classifier") if f"{c}.weight" in heads_out),
                      None)
    head = heads_out[f"{classifier}.weight"] if classifier else None
    if head is not None and head.dim() != 2:
        raise CheckpointError(f"{where}: {classifier}.weight has shape {tuple(head.shape)}; a "
                              f"classifier is 2-D (labels, hidden_size)")
    dist_head = "distillation_classifier.weight" in heads_out
    # Our key <- the file's keys (three of them, concatenated, for qkv).
    spec: list[tuple[str, tuple[str, ...]]] = [
        ("patch_embed.proj.weight", (E + "patch_embeddings.projection.weight",)),
        ("patch_embed.proj.bias", (E + "patch_embeddings.projection.bias",)),
        ("cls_token", (E + "cls_token",)),
        ("pos.pos_embed", (E + "position_embeddings",)),
        ("norm.weight", (prefix + "layernorm.weight",)),
        ("norm.bias", (prefix + "layernorm.bias",)),
    ]
    if dist:
        spec.append(("dist_token", (E + "distillation_token",)))
    if regs:
        spec.append(("reg_token", (E + "register_tokens",)))
    spec += _blocks(keys, L, depth, qkv_bias)
    if classifier:
        spec += [("head.weight", (f"{classifier}.weight",)), ("head.bias", (f"{classifier}.bias",))]
    if dist_head and dist and classifier:
        spec += [("head_dist.weight", ("distillation_classifier.weight",)),
                 ("head_dist.bias", ("distillation_classifier.bias",))]

    ignored = _check_mapping(spec, state, state, prefix=prefix, where=where, kind=kind,
                             needs=f"config.json ({kind}, {depth} layers, qkv_bias {qkv_bias})")
    mean, std = _hf_normalisation(directory, in_chans, family.normalisation)
    try:
        cfg = ViTConfig(img_size=(grid * patch, grid * patch), patch_size=patch,
                        in_chans=in_chans, width=width, depth=depth, heads=heads,
                        mlp_ratio=_mlp_ratio(hidden, width),
                        num_classes=head.shape[0] if head is not None else 0,
                        qkv_bias=qkv_bias, norm_eps=norm_eps, class_token=True,
                        dist_token=dist, dist_head=dist_head, num_registers=regs,
                        pos_prefix_tokens=1 + int(dist), layer_scale=bool(keys.layer_scale),
                        pool="cls", pos_interp="bicubic", mean=mean, std=std, name=f"hf-{kind}",
                        **family.config(kind))
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: config.json and its weights give no valid config: "
                              f"{e}") from None

    problems = _shape_problems(spec, state, _expected_shapes(cfg, blocks=depth) or {})
    if problems:
        raise CheckpointError(f"{where}: its weights do not match config.json: shape mismatch: "
                              f"{_some(problems)}")

    ours = {mine: _joined(state, theirs) for mine, theirs in spec}
    return _built(cfg, ours, where=where, ignored=ignored, stacklevel=4)


def _blocks(keys: EncoderKeys, L: str, depth: int,
            qkv_bias: bool) -> list[tuple[str, tuple[str, ...]]]:
    """The mapping of blocks 0..depth-1 (our key <- the file's, q, k and v concatenated)."""
    spec: list[tuple[str, tuple[str, ...]]] = []
    names = keys.names
    for i in range(depth):
        b, o = f"{L}{i}.", f"blocks.{i}."
        att = b + "attention.attention."
        qkv = ("query", "key", "value")
        spec.append((o + "attn.qkv.weight", tuple(att + f"{n}.weight" for n in qkv)))
        if qkv_bias:
            spec.append((o + "attn.qkv.bias", tuple(att + f"{n}.bias" for n in qkv)))
        spec += [(o + "attn.proj.weight", (b + "attention.output.dense.weight",)),
                 (o + "attn.proj.bias", (b + "attention.output.dense.bias",))]
        spec += [(o + mine, (b + theirs,)) for mine, theirs in keys.layer_scale]
        spec += [(o + f"{mine}.{p}", (b + f"{theirs}.{p}",))
                 for mine, theirs in names.items() for p in ("weight", "bias")]
    return spec


def _shape_problems(spec: list[tuple[str, tuple[str, ...]]], state: dict[str, Any],
                    shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Each file tensor whose shape is not its share of our tensor's (q, k, v: a third)."""
    problems = []
    for ours, theirs in spec:
        want = shapes.get(ours)
        if want is None:
            continue
        part = (want[0] // len(theirs),) + want[1:] if want else want
        problems += [f"{t}: checkpoint {tuple(state[t].shape)} vs expected {part}"
                     for t in theirs if tuple(state[t].shape) != part]
    return problems
