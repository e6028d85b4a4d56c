"""The block's MLP, plain or gated, and the activations it may use.

plain:  fc2(act(fc1(x)))                  ViT, DeiT, DINOv2, CLIP, SigLIP, DINOv3
gated:  fc2(act(gate(x)) * up(x))         SwiGLU with act 'silu' (DINOv3 H+ / 7B):
        transformers' DINOv3ViTGatedMLP, down_proj(act_fn(gate_proj(x)) * up_proj(x)).

The gated MLP's gate and up projections are one layer, gate_fc1 = [gate_proj; up_proj]
(2F rows, gate first, as DINOv2's SwiGLUFFN w12), split after the product like the
attention's fused qkv: one MatMul and one int8 kernel (DynamicQuantizeMatMul) instead of
two layers on one LayerNorm, which ORT's int8 runs as two MatMulIntegerToFloat behind a
shared DynamicQuantizeLinear. fc2 is down_proj.

Shapes in comments: B batch, T tokens, D width, F hidden (width * mlp_ratio).
"""

from __future__ import annotations

import torch
from torch import nn

from vit_deploy.runtime.config import ViTConfig


class QuickGELU(nn.Module):
    """x · sigmoid(1.702 x): the activation OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def activation(name: str) -> nn.Module:
    """The module of a ViTConfig.act (config.ACTIVATIONS)."""
    if name == "quick_gelu":
        return QuickGELU()
    if name == "silu":
        return nn.SiLU()
    return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")


class MLP(nn.Module):
    """(B, T, D) -> (B, T, D), plain or gated as cfg.mlp says."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        hidden = int(cfg.width * cfg.mlp_ratio)
        self.gated = cfg.mlp == "gated"
        if self.gated:
            self.gate_fc1 = nn.Linear(cfg.width, 2 * hidden)  # [gate; up]
        else:
            self.fc1 = nn.Linear(cfg.width, hidden)
        self.act = activation(cfg.act)
        self.fc2 = nn.Linear(hidden, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.fc2(self.act(self.fc1(x)))  # (B, T, D)
        gate, up = self.gate_fc1(x).chunk(2, dim=-1)  # 2 x (B, T, F)
        return self.fc2(self.act(gate) * up)  # (B, T, D)
