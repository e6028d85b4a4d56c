"""Checkpoints: our safetensors (config in the header), timm state dicts, Hugging Face directories.

Pickles are loaded only with weights_only. Each foreign loader maps keys onto our layout
and sets the config from the source, including how the source resamples position
embeddings (timm: bicubic with antialias; Hugging Face ViT, DeiT, DINOv2: bicubic without;
DINOv2 with registers: with), so the exported graph gives the source framework's outputs
at any resolution.

A checkpoint may lie: its config may disagree with its weights, or its tensors with each
other. Every loader compares what the config says with what the tensors hold before it
builds anything, and refuses a disagreement with a message that names both sides. Every
tensor in the file is used or reported: unused ones are an error, except those known not
to matter to the forward pass (a Hugging Face pooler, a mask token), which are a
CheckpointWarning.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import stat
import warnings
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from vit_deploy.runtime.files import write_bytes_atomic
from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError
from vit_deploy.runtime.config import IMAGENET_MEAN, IMAGENET_STD, ViTConfig, check_normalization
from vit_deploy.export.model import ViT, build_model

CONFIG_KEY = "vit_deploy.config"


class CheckpointError(VitDeployError, ValueError):
    """A checkpoint that cannot be loaded into the model: says which keys and why."""

    exit_code = BAD_INPUT


class CheckpointWarning(UserWarning):
    """Tensors in a checkpoint that the model does not use and that do not change its
    outputs (a Hugging Face pooler, a masked-image-modelling token)."""


def save_weights(model: ViT, path: str | Path) -> Path:
    """Write the state dict as safetensors (atomically), the config in its metadata."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    return write_bytes_atomic(path, save(state, metadata={CONFIG_KEY: model.cfg.to_json()}))


def not_a_file(path: str | Path) -> str | None:
    """Why `path` cannot be read as a checkpoint's file, or None when it can: a regular
    file once symlinks are resolved. A link to /dev/zero or /dev/urandom would be read
    until memory runs out, a FIFO blocks the reader forever: both are refused unopened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return ("a broken link (to a file that does not exist)" if os.path.islink(path)
                else "missing")
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    real = os.path.realpath(path)
    return kind + (f" ({real!r})" if real != os.path.abspath(path) else "")


def require_file(path: str | Path, what: str) -> None:
    """CheckpointError naming `path` unless it is a regular file (not_a_file)."""
    why = not_a_file(path)
    if why == "missing":
        raise CheckpointError(f"{what} {str(path)!r} does not exist")
    if why is not None:
        raise CheckpointError(f"{what} {str(path)!r} is {why}; expected a regular file")


def read_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) from .safetensors, or .pth/.pt/.bin loaded with weights_only=True.

    Keys must be strings and tensors floating point: anything else is not a set of weights."""
    path = Path(path)
    require_file(path, "checkpoint")
    if path.suffix == ".safetensors":
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                metadata = dict(f.metadata() or {})
            state = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {e}") from None
        _check_tensors(state, path)
        return state, metadata
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError for code, RuntimeError for garbage
        raise CheckpointError(
            f"{str(path)!r} could not be loaded as plain weights (weights_only=True refuses "
            f"pickled code): {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    for key in ("model", "state_dict", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{str(path)!r} does not hold a state dict of tensors")
    _check_tensors(obj, path)
    return obj, {}


def _check_tensors(state: dict[Any, torch.Tensor], path: Path) -> None:
    odd = [k for k in state if not isinstance(k, str)]
    if odd:
        raise CheckpointError(f"{str(path)!r} is not a state dict: its keys must be strings, "
                              f"it has {_some([repr(k)[:40] for k in odd])}")
    not_float = [f"{k} ({str(v.dtype).removeprefix('torch.')})" for k, v in sorted(state.items())
                 if not v.is_floating_point()]
    if not_float:
        raise CheckpointError(f"{str(path)!r} holds tensors that are not floating point, so not "
                              f"weights: {_some(not_float)}")


def load_model(path: str | Path, cfg: ViTConfig | None = None) -> ViT:
    """Our own checkpoints carry their config; for others pass `cfg` (the layout must match)."""
    state, metadata = read_state_dict(path)
    return model_from_state(state, metadata, source=str(path), cfg=cfg)


def model_from_state(state: dict[str, torch.Tensor], metadata: dict[str, str], *, source: str,
                     cfg: ViTConfig | None = None) -> ViT:
    """A model in our layout: the config from the checkpoint's metadata, else `cfg`."""
    said = "the given config says"
    if CONFIG_KEY in metadata:
        cfg = _config_from_metadata(metadata[CONFIG_KEY], source)
        said = "the checkpoint's config says"
    if cfg is None:
        raise CheckpointError(f"{source!r} carries no vit-deploy config; give the model "
                              f"settings (variant, patch, ...) that match it")
    return _build_checked(cfg, state, source=source, said=said)


def _config_from_metadata(text: Any, source: str) -> ViTConfig:
    where = f"{source}: the config in its metadata ({CONFIG_KEY})"
    try:
        data = json.loads(text)
    except (ValueError, TypeError, RecursionError) as e:
        raise CheckpointError(f"{where} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{where} is a JSON {type(data).__name__}, not an object: "
                              f"{str(text)[:60]!r}")
    try:
        return ViTConfig.from_dict(data)
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        raise CheckpointError(f"{where} is not a valid config: {e}") from None


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


def _indices(state: dict[str, Any], prefix: str) -> list[int]:
    """Sorted N of the keys `prefix`N.… (blocks.N., encoder.layer.N.)."""
    pattern = re.compile(re.escape(prefix) + r"(\d{1,9})\.")
    return sorted({int(m.group(1)) for k in state if (m := pattern.match(k))})


def _numbered(idx: list[int], n: int) -> bool:
    """Whether the sorted, distinct `idx` are exactly 0..n-1 (without building range(n): a
    config may say a depth of two billion)."""
    return len(idx) == n and (n == 0 or idx[-1] == n - 1)


def _describe(prefix: str, idx: list[int]) -> str:
    """'blocks.0-1', 'blocks.0, 2; blocks.1 missing', 'none'."""
    if not idx:
        return "none"
    spans: list[list[int]] = []
    for i in idx:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    def text(ss: list[list[int]]) -> str:
        return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ss)

    gaps = ([[0, spans[0][0] - 1]] if spans[0][0] > 0 else []) + [
        [a[1] + 1, b[0] - 1] for a, b in itertools.pairwise(spans)]
    missing = f"; {prefix}{text(gaps[:5])}{' ...' if len(gaps) > 5 else ''} missing" if gaps else ""
    return f"{prefix}{text(spans[:5])}{' ...' if len(spans) > 5 else ''}{missing}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _and_more(items: list) -> str:
    return f" (and {_count(len(items) - 1, 'more block')})" if len(items) > 1 else ""


def _some(items: list, n: int = 5) -> str:
    return f"{items[:n]}" + (f" (+{len(items) - n} more)" if len(items) > n else "")


def _mlp_ratio(hidden: int, width: int) -> float:
    """The ratio the model turns back into `hidden` (int(width * ratio) == hidden): hidden /
    width rounds down for some pairs (11, 15), so nudge it up by ulps until it does not."""
    ratio = hidden / width
    while int(width * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


FORMATS = ("auto", "vit-deploy", "timm", "hf")
# timm does not store the head count; these are the standard widths (ViT / DeiT / DINOv2).
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16, 1536: 24}
HF_TYPES = {"vit", "deit", "dinov2", "dinov2_with_registers"}
# The image towers of CLIP, SigLIP, SigLIP 2 and DINOv3 (loaded by _load_tower).
TOWER_TYPES = {"clip_vision_model", "siglip_vision_model", "siglip2_vision_model", "dinov3_vit"}


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
    mapped = {("pos.pos_embed" if k == "pos_embed" else k): v for k, v in state.items()}
    return _build_checked(cfg, mapped, source=source, said="the config read from its tensors says")


def _square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


# -- Hugging Face -------------------------------------------------------------------------
HF_PREFIXES = ("vit.", "deit.", "dinov2_with_registers.", "dinov2.")
# Tensors a Hugging Face checkpoint may carry that do not change the features we export:
# ViTModel's pooler (dense + tanh on the class token, not part of last_hidden_state) and
# the masked-image-modelling token (used only with bool_masked_pos).
HF_IRRELEVANT = (re.compile(r"pooler\."), re.compile(r"embeddings\.mask_token$"))
_MISSING = object()


def load_hf(directory: Path) -> ViT:
    """ViT / DeiT / Dinov2 / Dinov2WithRegisters, with or without a classification head;
    the image towers of CLIP (± projection), SigLIP, SigLIP 2 and DINOv3."""
    directory = Path(directory)
    where = str(directory)
    config_path = directory / "config.json"
    if not_a_file(config_path) == "missing":
        raise CheckpointError(f"{where!r} has no config.json: not a Hugging Face "
                              f"checkpoint directory")
    require_file(config_path, "Hugging Face config")
    hf = _read_json(config_path)
    kind = hf.get("model_type")
    if isinstance(kind, str) and kind in TOWER_TYPES:
        return _load_tower(directory, kind, hf)
    if not isinstance(kind, str) or kind not in HF_TYPES:
        raise CheckpointError(f"Hugging Face model_type {kind!r} is not supported; supported: "
                              f"{sorted(HF_TYPES | TOWER_TYPES)}")
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
    norm_eps = get.number("layer_norm_eps", 1e-12)
    registers = get.int("num_register_tokens", None, minimum=0)
    if width % heads:
        raise CheckpointError(f"{str(config_path)!r}: num_attention_heads {heads} does not "
                              f"divide hidden_size {width}")

    state = _hf_state(directory, where)
    prefix = next((p for p in HF_PREFIXES if any(k.startswith(p) for k in state)), "")
    body = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    heads_out = {k: v for k, v in state.items() if not k.startswith(prefix)} if prefix else {}
    E, L = prefix + "embeddings.", prefix + "encoder.layer."
    dino = kind.startswith("dinov2")

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
    fc1 = "mlp.fc1.weight" if dino else "intermediate.dense.weight"
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
    if dino:
        names = {"norm1": "norm1", "norm2": "norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
    else:
        names = {"norm1": "layernorm_before", "norm2": "layernorm_after",
                 "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    for i in range(depth):
        b, o = f"{L}{i}.", f"blocks.{i}."
        att = b + "attention.attention."
        qkv = ("query", "key", "value")
        spec.append((o + "attn.qkv.weight", tuple(att + f"{n}.weight" for n in qkv)))
        if qkv_bias:
            spec.append((o + "attn.qkv.bias", tuple(att + f"{n}.bias" for n in qkv)))
        spec += [(o + "attn.proj.weight", (b + "attention.output.dense.weight",)),
                 (o + "attn.proj.bias", (b + "attention.output.dense.bias",))]
        if dino:
            spec += [(o + "ls1.gamma", (b + "layer_scale1.lambda1",)),
                     (o + "ls2.gamma", (b + "layer_scale2.lambda1",))]
        spec += [(o + f"{mine}.{p}", (b + f"{theirs}.{p}",))
                 for mine, theirs in names.items() for p in ("weight", "bias")]
    if classifier:
        spec += [("head.weight", (f"{classifier}.weight",)), ("head.bias", (f"{classifier}.bias",))]
    if dist_head and dist and classifier:
        spec += [("head_dist.weight", ("distillation_classifier.weight",)),
                 ("head_dist.bias", ("distillation_classifier.bias",))]

    ignored = _check_mapping(spec, state, state, prefix=prefix, where=where, kind=kind,
                             needs=f"config.json ({kind}, {depth} layers, qkv_bias {qkv_bias})")
    mean, std = _hf_normalisation(directory, in_chans)
    try:
        cfg = ViTConfig(img_size=(grid * patch, grid * patch), patch_size=patch,
                        in_chans=in_chans, width=width, depth=depth, heads=heads,
                        mlp_ratio=_mlp_ratio(hidden, width),
                        num_classes=head.shape[0] if head is not None else 0,
                        qkv_bias=qkv_bias, norm_eps=norm_eps, class_token=True,
                        dist_token=dist, dist_head=dist_head, num_registers=regs,
                        pos_prefix_tokens=1 + int(dist), layer_scale=dino, pool="cls",
                        pos_interp="bicubic", pos_antialias=kind == "dinov2_with_registers",
                        mean=mean, std=std, name=f"hf-{kind}")
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: config.json and its weights give no valid config: "
                              f"{e}") from None

    shapes = _expected_shapes(cfg, blocks=depth) or {}
    problems = []
    for ours, theirs in spec:
        want = shapes.get(ours)
        if want is None:
            continue
        part = (want[0] // len(theirs),) + want[1:] if want else want
        problems += [f"{t}: checkpoint {tuple(state[t].shape)} vs expected {part}"
                     for t in theirs if tuple(state[t].shape) != part]
    if problems:
        raise CheckpointError(f"{where}: its weights do not match config.json: shape mismatch: "
                              f"{_some(problems)}")

    ours = {mine: _joined(state, theirs) for mine, theirs in spec}
    return _built(cfg, ours, where=where, ignored=ignored, stacklevel=3)


def _joined(state: dict[str, torch.Tensor], theirs: Sequence[str]) -> torch.Tensor:
    """Our one tensor from their one or several (concatenated: separate q, k, v)."""
    return torch.cat([state[t] for t in theirs]) if len(theirs) > 1 else state[theirs[0]]


def _built(cfg: ViTConfig, ours: dict[str, torch.Tensor], *, where: str, ignored: Sequence[str],
           stacklevel: int) -> ViT:
    """The model `cfg` builds with the weights `ours`; a CheckpointWarning names the
    checkpoint's tensors that were not used (at the caller's caller: `stacklevel`)."""
    model = build_model(cfg, seed=None)
    load_state(model, ours, source=where)
    if ignored:
        warnings.warn(f"{where}: not used, these tensors do not change the exported outputs: "
                      f"{_some(ignored)}", CheckpointWarning, stacklevel=stacklevel)
    return model


def _read_json(path: Path) -> dict[str, Any]:
    require_file(path, "JSON file")
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{str(path)!r} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{str(path)!r} is a JSON {type(data).__name__}, not an object")
    return data


class _HFConfig:
    """Typed reads of config.json: a wrong type or range is a CheckpointError naming the key."""

    def __init__(self, data: dict[str, Any], path: Path):
        self.data, self.path = data, path

    def _get(self, key: str, default: Any) -> Any:
        if key not in self.data:
            if default is _MISSING:
                raise CheckpointError(f"{str(self.path)!r} has no {key}")
            return _MISSING
        return self.data[key]

    def _fail(self, key: str, expected: str) -> CheckpointError:
        return CheckpointError(f"{str(self.path)!r}: {key} must be {expected}, got "
                               f"{repr(self.data[key])[:40]}")

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> Any:
        v = self._get(key, default)
        if v is _MISSING:
            return default
        if not _is_int(v) or not minimum <= v < 2**31:
            raise self._fail(key, f"an integer >= {minimum}")
        return v

    def pair(self, key: str, default: Any = _MISSING) -> Any:
        """An int (square), or for image_size a pair of ints; patch_size a pair only if equal."""
        v = self._get(key, default)
        if v is _MISSING:
            return default
        if _is_int(v) and 1 <= v < 2**31:
            return v if key == "patch_size" else (v, v)
        if isinstance(v, list) and len(v) == 2 and all(_is_int(x) and 1 <= x < 2**31 for x in v):
            if key != "patch_size":
                return tuple(v)
            if v[0] == v[1]:
                return v[0]
        raise self._fail(key, "a positive integer" + (" or a pair of them" if key != "patch_size"
                                                      else ""))

    def number(self, key: str, default: Any = _MISSING) -> Any:
        v = self._get(key, default)
        if v is _MISSING:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not 0 < v < 1e6:
            raise self._fail(key, "a positive finite number")
        return float(v)

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        v = self._get(key, default)
        if v is _MISSING:
            return default
        if not isinstance(v, bool):
            raise self._fail(key, "true or false")
        return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _hf_normalisation(directory: Path, channels: int = 3, default: tuple = (
        IMAGENET_MEAN, IMAGENET_STD)) -> tuple[tuple[float, ...], tuple[float, ...]]:
    pre = directory / "preprocessor_config.json"
    if pre.is_file():
        data = _read_json(pre)
        if "image_mean" in data and "image_std" in data:
            values = []
            for key in ("image_mean", "image_std"):
                v = data[key]
                v = [v] * channels if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                if not isinstance(v, list) or not v or not all(
                        isinstance(x, (int, float)) and not isinstance(x, bool)
                        and math.isfinite(x) for x in v):
                    raise CheckpointError(f"{str(pre)!r}: {key} must be a list of numbers, got "
                                          f"{repr(data[key])[:40]}")
                values.append(tuple(float(x) for x in v))
            try:  # the bounds the manifest is held to on load: refused here, not after writing
                check_normalization(*values, channels=channels, what="image_")
            except ValueError as e:
                raise CheckpointError(f"{str(pre)!r}: {e}") from None
            return values[0], values[1]
    return default


# -- Hugging Face image towers: CLIP, SigLIP / SigLIP 2, DINOv3 ---------------------------
# What each tower's config.json `hidden_act` becomes (others are refused).
TOWER_ACTS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
# The normalisation each family's processor uses when the directory carries none.
OPENAI_CLIP_MEAN, OPENAI_CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954,
                                                                           0.26130258, 0.27577711)
TOWER_NORMALISATION = {"clip_vision_model": (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
                       "siglip_vision_model": ((0.5,) * 3, (0.5,) * 3),
                       "siglip2_vision_model": ((0.5,) * 3, (0.5,) * 3),
                       "dinov3_vit": (IMAGENET_MEAN, IMAGENET_STD)}


def _load_tower(directory: Path, kind: str, hf: dict[str, Any]) -> ViT:
    """CLIPVisionModel(WithProjection), SiglipVisionModel, Siglip2VisionModel, DINOv3ViTModel.

    CLIP: LayerNorm before the blocks, quick_gelu, post_layernorm on the pooled class token
    (our fc_norm; the patch tokens stay un-normed, as transformers' last_hidden_state), the
    bias-free visual projection when present. SigLIP: no class token, every token through
    post_layernorm, the attention-pooling head. SigLIP 2: its linear patch embedding
    (patches flattened row, column, channel) becomes the convolution; the table resized
    bilinear with antialias. DINOv3: rotary positions, registers, layer scale; absent q/k/v,
    output and MLP biases are zeros."""
    where, config_path = str(directory), directory / "config.json"
    get = _HFConfig(hf, config_path)
    width, depth = get.int("hidden_size"), get.int("num_hidden_layers")
    heads, patch = get.int("num_attention_heads"), get.pair("patch_size")
    in_chans, hidden = get.int("num_channels", 3), get.int("intermediate_size")
    norm_eps = get.number("layer_norm_eps", 1e-6 if kind.startswith("siglip") else 1e-5)
    act = hf.get("hidden_act", "gelu")
    if act not in TOWER_ACTS or hf.get("use_gated_mlp", False):
        raise CheckpointError(f"{where}: only {sorted(TOWER_ACTS)} MLPs are supported, the "
                              f"checkpoint uses {act!r}"
                              + (" in a gated MLP" if hf.get("use_gated_mlp") else ""))
    if width % heads:
        raise CheckpointError(f"{str(config_path)!r}: num_attention_heads {heads} does not "
                              f"divide hidden_size {width}")
    state = _hf_state(directory, where)
    prefix = next((p for p in ("vision_model.", "model.") if any(
        k.startswith(p + "embeddings.") for k in state)), "")
    E = prefix + "embeddings."
    dino, clip, siglip2 = kind == "dinov3_vit", kind == "clip_vision_model", kind.startswith("siglip2")
    L = prefix + ("layer." if dino else "encoder.layers.")
    if dino and not any(k.startswith(L) for k in state):
        L = prefix + "model.layer."
    layers = _indices(state, L)
    if not _numbered(layers, depth):
        raise CheckpointError(f"{where}: config.json says num_hidden_layers {depth}, its weights "
                              f"hold {_count(len(layers), 'layer')} ({_describe(L, layers)})")
    given = dict(state)  # the file's tensors; `state` gains the zeros of absent biases
    spec: list[tuple[str, tuple[str, ...]]] = []
    convert: dict[str, Any] = {}  # our key -> how the file's tensor becomes ours

    def bias(key: str, rows: int) -> str:
        if key not in state:
            state[key] = torch.zeros(rows)
        return key

    for i in layers:
        b, o = f"{L}{i}.", f"blocks.{i}."
        att = b + ("attention." if dino else "self_attn.")
        qkv = tuple(att + f"{n}_proj" for n in "qkv")
        spec.append((o + "attn.qkv.weight", tuple(q + ".weight" for q in qkv)))
        if any(q + ".bias" in state for q in qkv):
            spec.append((o + "attn.qkv.bias", tuple(bias(q + ".bias", width) for q in qkv)))
        out = att + ("o_proj" if dino else "out_proj")
        spec += [(o + "attn.proj.weight", (out + ".weight",)),
                 (o + "attn.proj.bias", (bias(out + ".bias", width),))]
        fc1, fc2 = (b + "mlp.up_proj", b + "mlp.down_proj") if dino else (b + "mlp.fc1", b + "mlp.fc2")
        spec += [(o + "mlp.fc1.weight", (fc1 + ".weight",)),
                 (o + "mlp.fc1.bias", (bias(fc1 + ".bias", hidden),)),
                 (o + "mlp.fc2.weight", (fc2 + ".weight",)),
                 (o + "mlp.fc2.bias", (bias(fc2 + ".bias", width),))]
        norms = ("norm1", "norm2") if dino else ("layer_norm1", "layer_norm2")
        spec += [(o + f"norm{n}.{p}", (b + f"{theirs}.{p}",))
                 for n, theirs in enumerate(norms, start=1) for p in ("weight", "bias")]
        if dino:
            spec += [(o + "ls1.gamma", (b + "layer_scale1.lambda1",)),
                     (o + "ls2.gamma", (b + "layer_scale2.lambda1",))]
    patch_key = E + ("patch_embeddings" if dino else "patch_embedding")
    spec.append(("patch_embed.proj.weight", (patch_key + ".weight",)))
    if not clip:
        spec.append(("patch_embed.proj.bias", (patch_key + ".bias",)))
    if siglip2:  # Linear over patches flattened (row, column, channel) -> a convolution
        convert["patch_embed.proj.weight"] = lambda t: t.reshape(
            t.shape[0], patch, patch, -1).permute(0, 3, 1, 2) if t.dim() == 2 else t
    regs, grid = 0, (0, 0)
    if dino:
        reg = state.get(E + "register_tokens")
        regs = reg.shape[1] if reg is not None and reg.dim() == 3 else 0
        spec.append(("cls_token", (E + "cls_token",)))
        if regs:
            spec.append(("reg_token", (E + "register_tokens",)))
        elif reg is not None and reg.numel() == 0:  # num_register_tokens 0: an empty tensor
            given.pop(E + "register_tokens")
        spec += [("norm.weight", (prefix + "norm.weight",)), ("norm.bias", (prefix + "norm.bias",))]
        size = get.pair("image_size", (224, 224))
        grid = (size[0] // patch, size[1] // patch)
    else:
        pos = state.get(E + "position_embedding.weight")
        rows = pos.shape[0] if pos is not None and pos.dim() == 2 else -1
        side = math.isqrt(max(rows - int(clip), 0))
        if rows < 0 or not _square(rows - int(clip)):
            raise CheckpointError(f"{where}: {E}position_embedding.weight "
                                  f"{'is missing' if pos is None else f'has shape {tuple(pos.shape)}'}"
                                  f"; it must hold {'1 + ' if clip else ''}a square grid of rows")
        grid = (side, side)
        expected = get.int("num_patches", None) if siglip2 else None
        if expected is not None and expected != side * side:
            raise CheckpointError(f"{where}: config.json says num_patches {expected}, its "
                                  f"position table holds {side * side} rows")
        spec.append(("pos.pos_embed", (E + "position_embedding.weight",)))
        convert["pos.pos_embed"] = lambda t: t[None]
        post = prefix + "post_layernorm"
        if clip:
            spec += [("cls_token", (E + "class_embedding",)),
                     ("pre_norm.weight", (prefix + "pre_layrnorm.weight",)),
                     ("pre_norm.bias", (prefix + "pre_layrnorm.bias",)),
                     ("fc_norm.weight", (post + ".weight",)), ("fc_norm.bias", (post + ".bias",))]
            convert["cls_token"] = lambda t: t.reshape(1, 1, -1)
            if "visual_projection.weight" in state:
                spec.append(("proj.weight", ("visual_projection.weight",)))
        else:
            spec += [("norm.weight", (post + ".weight",)), ("norm.bias", (post + ".bias",))]
    use_head = not clip and not dino and any(k.startswith(prefix + "head.") for k in state)
    if use_head:  # nn.MultiheadAttention's packed in_proj: q, then k and v
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
    proj = state.get("visual_projection.weight") if clip else None
    mean, std = _hf_normalisation(directory, in_chans, TOWER_NORMALISATION[kind])
    try:
        cfg = ViTConfig(
            img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=in_chans,
            width=width, depth=depth, heads=heads, mlp_ratio=_mlp_ratio(hidden, width),
            num_classes=0, qkv_bias=any(k.endswith("attn.qkv.bias") for k, _ in spec),
            norm_eps=norm_eps, class_token=clip or dino, num_registers=regs,
            pos_prefix_tokens=int(clip), layer_scale=dino, fc_norm=clip,
            pool="cls" if clip or dino else "map" if use_head else "mean",
            pos_embed="rope" if dino else "learned",
            pos_interp="bilinear" if siglip2 else "bicubic", pos_antialias=siglip2,
            act=TOWER_ACTS[act], pre_norm=clip, patch_bias=not clip,
            proj_dim=proj.shape[0] if proj is not None and proj.dim() == 2 else 0,
            rope_theta=get.number("rope_theta", 100.0), mean=mean, std=std,
            name=f"hf-{kind.removesuffix('_vision_model').removesuffix('_vit')}")
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: config.json and its weights give no valid config: "
                              f"{e}") from None
    return _build_mapped(cfg, state, given, spec, convert, where=where, kind=kind, prefix=prefix)


def _hf_state(directory: Path, where: str) -> dict[str, torch.Tensor]:
    """The tensors of a Hugging Face directory: model.safetensors, else pytorch_model.bin."""
    weights = [directory / n for n in ("model.safetensors", "pytorch_model.bin")
               if not_a_file(directory / n) != "missing"]  # the first there, file or not
    if not weights:
        raise CheckpointError(f"{where!r} has neither model.safetensors nor pytorch_model.bin")
    state, _ = read_state_dict(weights[0])
    return state


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
        t = _joined(state, theirs)
        ours[mine] = convert[mine](t) if mine in convert else t
    shapes = _expected_shapes(cfg, blocks=cfg.depth) or {}
    wrong = [f"{mine} (from {', '.join(theirs)}): checkpoint {tuple(ours[mine].shape)} vs "
             f"expected {shapes[mine]}" for mine, theirs in spec
             if mine in shapes and tuple(ours[mine].shape) != shapes[mine]]
    if wrong:
        raise CheckpointError(f"{where}: its weights do not match config.json: shape mismatch: "
                              f"{_some(wrong)}")
    return _built(cfg, ours, where=where, ignored=ignored, stacklevel=4)
