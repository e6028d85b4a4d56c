"""What a Hugging Face directory holds besides its key names: config.json read with types
(_HFConfig), its tensors (model.safetensors, else pytorch_model.bin), the normalisation of
its preprocessor_config.json."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.checkpoints.files import _read_json, not_a_file, optional_file, read_state_dict
from vit_deploy.runtime.config import IMAGENET_MEAN, IMAGENET_STD, check_normalization

_MISSING = object()


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
    if optional_file(pre, "the checkpoint's preprocessing"):
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


def _hf_state(directory: Path, where: str) -> dict[str, torch.Tensor]:
    """The tensors of a Hugging Face directory: model.safetensors, else pytorch_model.bin."""
    weights = [directory / n for n in ("model.safetensors", "pytorch_model.bin")
               if not_a_file(directory / n) != "missing"]  # the first there, file or not
    if not weights:
        raise CheckpointError(f"{where!r} has neither model.safetensors nor pytorch_model.bin")
    state, _ = read_state_dict(weights[0])
    return state
