"""The one reader (and writer) of the config our checkpoints carry in their safetensors
metadata, under CONFIG_KEY: the key the exported ONNX graph's metadata uses too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import METADATA_CONFIG_KEY

CONFIG_KEY = METADATA_CONFIG_KEY  # "vit_deploy.config"


def config_metadata(cfg: ViTConfig) -> dict[str, str]:
    """The metadata save_weights writes: the config as JSON under CONFIG_KEY."""
    return {CONFIG_KEY: cfg.to_json()}


def carries_config(metadata: Mapping[str, str]) -> bool:
    """Whether a checkpoint's metadata carries our config (so it is one of ours)."""
    return CONFIG_KEY in metadata


def stored_config(metadata: Mapping[str, str], source: str) -> ViTConfig | None:
    """The config the metadata carries, None when it carries none; a CheckpointError naming
    `source` when it is not JSON, not an object or not a valid config."""
    if not carries_config(metadata):
        return None
    return _config_from_metadata(metadata[CONFIG_KEY], source)


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
