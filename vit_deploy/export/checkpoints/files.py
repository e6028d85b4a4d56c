"""Reading a checkpoint's files: regular files only (not_a_file, require_file), tensors from
safetensors or a pickle loaded with weights_only (read_state_dict), JSON objects (read_json)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from vit_deploy.export.checkpoints.describe import _some
from vit_deploy.runtime.files import not_a_file
from vit_deploy.export.checkpoints.errors import CheckpointError


def require_file(path: str | Path, what: str) -> None:
    """CheckpointError naming `path` unless it is a regular file (not_a_file)."""
    why = not_a_file(path)
    if why == "missing":
        raise CheckpointError(f"{what} {str(path)!r} does not exist")
    if why is not None:
        raise CheckpointError(f"{what} {str(path)!r} is {why}; expected a regular file")


def optional_file(path: str | Path, what: str) -> bool:
    """Whether a file a checkpoint may have (preprocessor_config.json, a timm config.json
    beside the weights) is there to read: False when nothing is at `path`; CheckpointError
    naming it when something is but cannot be read as one (a FIFO, a folder, a device, a
    broken link such as a half-downloaded hub cache leaves): never silently ignored, which
    would export other preprocessing than the checkpoint's."""
    if not os.path.lexists(path):
        return False
    require_file(path, what)
    return True


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


def _read_json(path: Path) -> dict[str, Any]:
    require_file(path, "JSON file")
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{str(path)!r} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{str(path)!r} is a JSON {type(data).__name__}, not an object")
    return data
