"""Family: one kind of Hugging Face directory. Which config.json model_types it reads (the
detection), the key map from its tensor names to ours, its own config fields, and the shared
reader that walks its blocks with that key map (encoder.load_encoder, tower.load_tower).
hf.FAMILIES lists them; a new family is a module that makes one, and a line there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vit_deploy.runtime.config import IMAGENET_MEAN, IMAGENET_STD


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json's model_type values it reads
    loader: Callable[..., Any]  # (directory, model_type, config.json, family) -> ViT
    keys: Any  # the key map `loader` walks: encoder.EncoderKeys, tower.TowerKeys
    config: Callable[..., dict[str, Any]]  # its own ViTConfig fields (what `loader` passes)
    normalisation: tuple = (IMAGENET_MEAN, IMAGENET_STD)  # without preprocessor_config.json

    def detects(self, model_type: object) -> bool:
        return isinstance(model_type, str) and model_type in self.model_types
