"""Weights on disk: safetensors with the config in the header; pickles only weights_only."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from vit_deploy.atomic import write_bytes_atomic
from vit_deploy.config import ViTConfig
from vit_deploy.model import ViT, build_model

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

