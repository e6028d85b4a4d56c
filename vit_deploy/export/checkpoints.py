"""Checkpoints: our safetensors (config in the header), timm state dicts, Hugging Face directories.

Pickles are loaded only with weights_only. Each foreign loader maps keys onto our layout
and sets the config from the source, including how the source resamples position
embeddings (timm: bicubic with antialias; Hugging Face ViT, DeiT, DINOv2: bicubic without;
DINOv2 with registers: with), so the exported graph gives the source framework's outputs
at any resolution.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from vit_deploy.atomic import write_bytes_atomic
from vit_deploy.config import IMAGENET_MEAN, IMAGENET_STD, ViTConfig
from vit_deploy.export.model import ViT, build_model

CONFIG_KEY = "vit_deploy.config"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the model: says which keys and why."""


def save_weights(model: ViT, path: str | Path) -> Path:
    """Write the state dict as safetensors (atomically), the config in its metadata."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    return write_bytes_atomic(path, save(state, metadata={CONFIG_KEY: model.cfg.to_json()}))


def read_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) from .safetensors, or .pth/.pt/.bin loaded with weights_only=True."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    if path.suffix == ".safetensors":
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                metadata = dict(f.metadata() or {})
            return load_file(str(path)), metadata
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {e}") from None
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError for code, RuntimeError for garbage
        raise CheckpointError(
            f"{str(path)!r} could not be loaded as plain weights (weights_only=True refuses "
            f"pickled code): {str(e).splitlines()[0]}") from None
    for key in ("model", "state_dict", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{str(path)!r} does not hold a state dict of tensors")
    return obj, {}


def load_model(path: str | Path, cfg: ViTConfig | None = None) -> ViT:
    """Our own checkpoints carry their config; for others pass `cfg` (the layout must match)."""
    state, metadata = read_state_dict(path)
    return model_from_state(state, metadata, source=str(path), cfg=cfg)


def model_from_state(state: dict[str, torch.Tensor], metadata: dict[str, str], *, source: str,
                     cfg: ViTConfig | None = None) -> ViT:
    """A model in our layout: the config from the checkpoint's metadata, else `cfg`."""
    if CONFIG_KEY in metadata:
        cfg = ViTConfig.from_json(metadata[CONFIG_KEY])
    if cfg is None:
        raise CheckpointError(f"{source!r} carries no vit-deploy config; give the model "
                              f"settings (variant, patch, ...) that match it")
    model = build_model(cfg, seed=None)
    load_state(model, state, source=source)
    return model


def load_state(model: ViT, state: dict[str, torch.Tensor], *, source: str) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(state)) if state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = []
        for label, items in (("missing", missing), ("unexpected", unexpected),
                             ("shape mismatch", shapes)):
            if items:
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                parts.append(f"{label} keys: {items[:5]}{more}")
        raise CheckpointError(f"{source} does not match the model layout: " + "; ".join(parts))
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


FORMATS = ("auto", "vit-deploy", "timm", "hf")
# timm does not store the head count; these are the standard widths (ViT / DeiT / DINOv2).
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16, 1536: 24}
HF_TYPES = {"vit", "deit", "dinov2", "dinov2_with_registers"}


def load_any(path: str | Path, *, source: str = "auto", heads: int | None = None,
             fallback_cfg: ViTConfig | None = None) -> tuple[ViT, str]:
    """(model, format) from our safetensors, a timm state dict or a Hugging Face directory."""
    path = Path(path)
    if source not in FORMATS:
        raise CheckpointError(f"--from must be one of {FORMATS}, got {source!r}")
    if source in ("auto", "hf") and path.is_dir():
        return load_hf(path), "hf"
    if source == "hf":
        raise CheckpointError(f"a Hugging Face checkpoint is a directory with config.json; "
                              f"{str(path)!r} is not")
    state, metadata = read_state_dict(path)
    if source in ("auto", "vit-deploy") and CONFIG_KEY in metadata:
        return model_from_state(state, metadata, source=str(path)), "vit-deploy"
    if source in ("auto", "timm") and "patch_embed.proj.weight" in state \
            and "pos_embed" in state:
        return load_timm(state, source=str(path), heads=heads), "timm"
    if fallback_cfg is None:
        raise CheckpointError(f"{str(path)!r} matches no known layout (vit-deploy, timm, Hugging "
                              f"Face); its first keys: {sorted(state)[:5]}")
    try:  # our layout without a config: the command's flags say which model
        return model_from_state(state, {}, source=str(path), cfg=fallback_cfg), "vit-deploy"
    except CheckpointError as e:
        raise CheckpointError(f"no known layout (vit-deploy, timm, Hugging Face) matches; "
                              f"against {fallback_cfg.name or 'the requested model'}: {e}") from None


# -- timm ---------------------------------------------------------------------------------
def timm_config(state: dict[str, torch.Tensor], *, heads: int | None = None) -> ViTConfig:
    """Infer a config from a timm VisionTransformer / DeiT / DeiT-3 state dict."""
    try:
        proj = state["patch_embed.proj.weight"]  # (D, C, P, P)
        width, in_chans, patch = proj.shape[0], proj.shape[1], proj.shape[2]
        depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
        hidden = state["blocks.0.mlp.fc1.weight"].shape[0]
        pos = state["pos_embed"].shape[1]
    except (KeyError, ValueError, IndexError) as e:
        raise CheckpointError(f"not a timm ViT state dict: missing {e}") from None
    cls, dist = "cls_token" in state, "dist_token" in state
    regs = state["reg_token"].shape[1] if "reg_token" in state else 0
    prefix = int(cls) + int(dist) + regs
    k = prefix if _square(pos - prefix) else 0 if _square(pos) else None  # no_embed_class: 0
    if k is None:
        raise CheckpointError(f"pos_embed has {pos} rows: no square grid with {prefix} or 0 "
                              f"prefix rows")
    grid = math.isqrt(pos - k)
    heads = heads or HEADS_BY_WIDTH.get(width)
    if heads is None:
        raise CheckpointError(f"timm checkpoints do not store the head count; width {width} is "
                              f"not a standard one: pass --heads")
    fc_norm = "fc_norm.weight" in state
    num_classes = state["head.weight"].shape[0] if "head.weight" in state else 0
    return ViTConfig(img_size=(grid * patch, grid * patch), patch_size=patch, in_chans=in_chans,
                     width=width, depth=depth, heads=heads, mlp_ratio=hidden / width,
                     num_classes=num_classes, qkv_bias="blocks.0.attn.qkv.bias" in state,
                     class_token=cls, dist_token=dist, dist_head="head_dist.weight" in state,
                     num_registers=regs, pos_prefix_tokens=k,
                     layer_scale="blocks.0.ls1.gamma" in state, fc_norm=fc_norm,
                     pool="mean" if fc_norm or not cls else "cls",
                     pos_interp="bicubic", pos_antialias=True, name="timm")


def load_timm(state: dict[str, torch.Tensor], *, source: str, heads: int | None = None) -> ViT:
    cfg = timm_config(state, heads=heads)
    mapped = {("pos.pos_embed" if k == "pos_embed" else k): v for k, v in state.items()}
    model = build_model(cfg, seed=None)
    load_state(model, mapped, source=source)
    return model


def _square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


# -- Hugging Face -------------------------------------------------------------------------
def load_hf(directory: Path) -> ViT:
    """ViT / DeiT / Dinov2 / Dinov2WithRegisters, with or without a classification head."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{str(directory)!r} has no config.json: not a Hugging Face "
                              f"checkpoint directory")
    hf = json.loads(config_path.read_text())
    kind = hf.get("model_type")
    if kind not in HF_TYPES:
        raise CheckpointError(f"Hugging Face model_type {kind!r} is not supported; supported: "
                              f"{sorted(HF_TYPES)}")
    if hf.get("hidden_act", "gelu") != "gelu" or hf.get("use_swiglu_ffn"):
        raise CheckpointError(f"only GELU MLPs are supported, the checkpoint uses "
                              f"{hf.get('hidden_act')!r}{' / SwiGLU' if hf.get('use_swiglu_ffn') else ''}")
    weights = [directory / n for n in ("model.safetensors", "pytorch_model.bin")
               if (directory / n).is_file()]
    if not weights:
        raise CheckpointError(f"{str(directory)!r} has neither model.safetensors nor "
                              f"pytorch_model.bin")
    state, _ = read_state_dict(weights[0])
    prefix = next((p for p in ("vit.", "deit.", "dinov2.") if any(k.startswith(p) for k in state)), "")
    body = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)} if prefix else state
    heads_out = {k: v for k, v in state.items() if not k.startswith(prefix)} if prefix else {}

    width, depth = hf["hidden_size"], hf["num_hidden_layers"]
    dist = "embeddings.distillation_token" in body
    regs = body["embeddings.register_tokens"].shape[1] if "embeddings.register_tokens" in body else 0
    classifier = next((c for c in ("classifier", "cls_classifier") if f"{c}.weight" in heads_out),
                      None)
    num_classes = heads_out[f"{classifier}.weight"].shape[0] if classifier else 0
    pos_rows = body["embeddings.position_embeddings"].shape[1] - 1 - int(dist)
    grid = math.isqrt(pos_rows)
    patch = hf["patch_size"]
    mean, std = _hf_normalisation(directory)
    cfg = ViTConfig(img_size=(grid * patch, grid * patch), patch_size=patch,
                    in_chans=hf.get("num_channels", 3), width=width, depth=depth,
                    heads=hf["num_attention_heads"],
                    mlp_ratio=(hf["intermediate_size"] / width if "intermediate_size" in hf
                               else float(hf.get("mlp_ratio", 4))),
                    num_classes=num_classes, qkv_bias=hf.get("qkv_bias", True),
                    norm_eps=hf.get("layer_norm_eps", 1e-12), class_token=True,
                    dist_token=dist, dist_head="distillation_classifier.weight" in heads_out,
                    num_registers=regs, pos_prefix_tokens=1 + int(dist),
                    layer_scale=kind.startswith("dinov2"), pool="cls", pos_interp="bicubic",
                    pos_antialias=kind == "dinov2_with_registers", mean=mean, std=std,
                    name=f"hf-{kind}")
    ours: dict[str, torch.Tensor] = {
        "patch_embed.proj.weight": body["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": body["embeddings.patch_embeddings.projection.bias"],
        "cls_token": body["embeddings.cls_token"],
        "pos.pos_embed": body["embeddings.position_embeddings"],
        "norm.weight": body["layernorm.weight"], "norm.bias": body["layernorm.bias"],
    }
    if dist:
        ours["dist_token"] = body["embeddings.distillation_token"]
    if regs:
        ours["reg_token"] = body["embeddings.register_tokens"]
    for i in range(depth):
        b, o = f"encoder.layer.{i}.", f"blocks.{i}."
        att = b + "attention.attention."
        ours[o + "attn.qkv.weight"] = torch.cat([body[att + f"{n}.weight"]
                                                 for n in ("query", "key", "value")])
        if cfg.qkv_bias:
            ours[o + "attn.qkv.bias"] = torch.cat([body[att + f"{n}.bias"]
                                                   for n in ("query", "key", "value")])
        ours[o + "attn.proj.weight"] = body[b + "attention.output.dense.weight"]
        ours[o + "attn.proj.bias"] = body[b + "attention.output.dense.bias"]
        if kind.startswith("dinov2"):
            names = {"norm1": "norm1", "norm2": "norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
            ours[o + "ls1.gamma"] = body[b + "layer_scale1.lambda1"]
            ours[o + "ls2.gamma"] = body[b + "layer_scale2.lambda1"]
        else:
            names = {"norm1": "layernorm_before", "norm2": "layernorm_after",
                     "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
        for mine, theirs in names.items():
            for p in ("weight", "bias"):
                ours[o + f"{mine}.{p}"] = body[b + f"{theirs}.{p}"]
    if classifier:
        ours["head.weight"], ours["head.bias"] = (heads_out[f"{classifier}.weight"],
                                                  heads_out[f"{classifier}.bias"])
    if cfg.dist_head and dist:
        ours["head_dist.weight"] = heads_out["distillation_classifier.weight"]
        ours["head_dist.bias"] = heads_out["distillation_classifier.bias"]
    model = build_model(cfg, seed=None)
    load_state(model, ours, source=str(directory))
    return model


def _hf_normalisation(directory: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    pre = directory / "preprocessor_config.json"
    if pre.is_file():
        data: dict[str, Any] = json.loads(pre.read_text())
        if "image_mean" in data and "image_std" in data:
            return tuple(data["image_mean"]), tuple(data["image_std"])
    return IMAGENET_MEAN, IMAGENET_STD
