"""2-D rotary position embeddings (DINOv3): computed from the patch grid, no table.

Each patch gets the normalised coordinates of its centre, in [-1, 1] on both axes
(y = 2 (i + 0.5) / gh - 1, x likewise), so any grid, any aspect ratio, has its angles;
nothing is resampled. A quarter of each head's dims rotates with y, a quarter with x, at
frequencies theta^-(4k / d); the other half is their rotate-half partner. Prefix tokens
(class, registers) are not rotated. Follows transformers' DINOv3ViTRopePositionEmbedding
and apply_rotary_pos_emb operation for operation, so the numbers are the same.

Shapes in comments: gh/gw patch grid, N = gh*gw, K prefix tokens, T = K + N, d head dim.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vit_deploy.runtime.config import ViTConfig


def rope_angles(grid_hw: tuple, inv_freq: torch.Tensor) -> torch.Tensor:
    """Angles (N, d) of the patches of a (gh, gw) grid, raster order: [y freqs, x freqs]
    tiled twice. A pure function of the grid: traced with symbolic gh, gw it stays dynamic."""
    gh, gw = grid_hw
    ys = (torch.arange(gh, dtype=torch.float32) + 0.5) / gh  # (gh,), arange(0.5, gh) / gh
    xs = (torch.arange(gw, dtype=torch.float32) + 0.5) / gw  # (gw,)
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1)  # (N, 2)
    coords = 2.0 * coords - 1.0  # [0, 1] -> [-1, 1]
    angles = 2 * math.pi * coords[:, :, None] * inv_freq[None, None, :]  # (N, 2, d/4)
    return angles.flatten(1, 2).tile(2)  # (N, d)


class RotaryPosEmbed(nn.Module):
    """cos and sin (1, 1, T, d) for every token: the prefix rows are cos 1, sin 0, so
    rotating them is an exact identity (no split and concatenation in every block)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.prefix = cfg.num_prefix_tokens
        d = cfg.head_dim
        inv_freq = 1 / cfg.rope_theta ** torch.arange(0, 1, 4 / d, dtype=torch.float32)  # (d/4,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, grid_hw: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        angles = rope_angles(grid_hw, self.inv_freq)  # (N, d)
        ones = torch.ones_like(angles[:1]).expand(self.prefix, -1)  # (K, d)
        cos = torch.cat([ones, angles.cos()], dim=0)  # (T, d)
        sin = torch.cat([ones * 0, angles.sin()], dim=0)  # (T, d)
        return cos[None, None], sin[None, None]  # (1, 1, T, d)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., d) -> (..., d): [-x2, x1] for the halves x1, x2."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (B, h, T, d) rotated by cos, sin (1, 1, T, d)."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
