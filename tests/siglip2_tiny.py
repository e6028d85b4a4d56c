"""The tiny random SigLIP 2 tower the NaFlex tests share: transformers' Siglip2VisionModel
(64 wide, 2 layers, 4 heads, patch 16, a 16x16 position table), its weights moved off the
initialisation (so nothing matches by accident), saved with save_pretrained."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import transformers as T


def tiny_siglip2(directory: Path) -> tuple[T.Siglip2VisionModel, Path]:
    """(the model, `directory` holding it), seed 0: the same weights on every call."""
    torch.manual_seed(0)
    hf = T.Siglip2VisionModel(T.Siglip2VisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        patch_size=16, num_patches=256)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.save_pretrained(directory)
    return hf, directory
