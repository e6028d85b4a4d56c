"""Hugging Face ViT and DeiT (ViTModel, ViTForImageClassification, DeiT with its
distillation token and head): resampled bicubic without antialias, as transformers does."""

from __future__ import annotations

from typing import Any

from vit_deploy.export.checkpoints.encoder import EncoderKeys, load_encoder
from vit_deploy.export.checkpoints.family import Family

KEYS = EncoderKeys(names={"norm1": "layernorm_before", "norm2": "layernorm_after",
                          "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"})


def config(kind: str) -> dict[str, Any]:
    return {"pos_antialias": False}


FAMILY = Family("vit", ("vit", "deit"), load_encoder, KEYS, config)
