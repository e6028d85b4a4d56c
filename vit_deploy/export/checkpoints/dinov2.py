"""DINOv2 and DINOv2 with registers (Dinov2Model, Dinov2WithRegistersModel): layer scale;
resampled bicubic, with antialias only with registers, as transformers does."""

from __future__ import annotations

from typing import Any

from vit_deploy.export.checkpoints.encoder import EncoderKeys, load_encoder
from vit_deploy.export.checkpoints.family import Family

KEYS = EncoderKeys(names={"norm1": "norm1", "norm2": "norm2", "mlp.fc1": "mlp.fc1",
                          "mlp.fc2": "mlp.fc2"},
                   layer_scale=(("ls1.gamma", "layer_scale1.lambda1"),
                                ("ls2.gamma", "layer_scale2.lambda1")))


def config(kind: str) -> dict[str, Any]:
    return {"pos_antialias": kind == "dinov2_with_registers"}


FAMILY = Family("dinov2", ("dinov2", "dinov2_with_registers"), load_encoder, KEYS, config)
