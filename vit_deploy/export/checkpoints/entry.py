"""The entry points: save_weights, load_model, model_from_state (our layout), and load_any,
which tells the formats apart: ours (the config in the metadata), a timm state dict, a Hugging
Face directory, or our layout with the command's flags as its config."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save

from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.checkpoints.files import read_state_dict
from vit_deploy.export.checkpoints.hf import load_hf
from vit_deploy.export.checkpoints.layout import _build_checked
from vit_deploy.export.checkpoints.metadata import carries_config, config_metadata, stored_config
from vit_deploy.export.checkpoints.timm import is_timm_state, load_timm
from vit_deploy.export.model import ViT
from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.files import write_bytes_atomic

FORMATS = ("auto", "vit-deploy", "timm", "hf")


def save_weights(model: ViT, path: str | Path) -> Path:
    """Write the state dict as safetensors (atomically), the config in its metadata."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    return write_bytes_atomic(path, save(state, metadata=config_metadata(model.cfg)))


def load_model(path: str | Path, cfg: ViTConfig | None = None) -> ViT:
    """Our own checkpoints carry their config; for others pass `cfg` (the layout must match)."""
    state, metadata = read_state_dict(path)
    return model_from_state(state, metadata, source=str(path), cfg=cfg)


def model_from_state(state: dict[str, torch.Tensor], metadata: dict[str, str], *, source: str,
                     cfg: ViTConfig | None = None) -> ViT:
    """A model in our layout: the config from the checkpoint's metadata, else `cfg`."""
    said = "the given config says"
    stored = stored_config(metadata, source)
    if stored is not None:
        cfg, said = stored, "the checkpoint's config says"
    if cfg is None:
        raise CheckpointError(f"{source!r} carries no vit-deploy config; give the model "
                              f"settings (variant, patch, ...) that match it")
    return _build_checked(cfg, state, source=source, said=said)


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
    if source in ("auto", "vit-deploy") and carries_config(metadata):
        return model_from_state(state, metadata, source=str(path)), "vit-deploy"
    if source in ("auto", "timm") and is_timm_state(state):
        return load_timm(state, source=str(path), heads=heads), "timm"
    if fallback_cfg is None:
        raise CheckpointError(f"{str(path)!r} matches no known layout (vit-deploy, timm, Hugging "
                              f"Face); its first keys: {sorted(state)[:5]}")
    try:  # our layout without a config: the command's flags say which model
        return model_from_state(state, {}, source=str(path), cfg=fallback_cfg), "vit-deploy"
    except CheckpointError as e:
        raise CheckpointError(f"no known layout (vit-deploy, timm, Hugging Face) matches; "
                              f"against {fallback_cfg.name or 'the requested model'}: {e}") from None
