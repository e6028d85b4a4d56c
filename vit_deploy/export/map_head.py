"""Attention pooling (MAP head, SigLIP / SigLIP 2): one learned probe attends over the
tokens, then a pre-norm MLP with a residual, as transformers'
SiglipMultiheadAttentionPoolingHead (an nn.MultiheadAttention, here written out with
scaled_dot_product_attention so the batch stays separate and the export stays plain).

A dense patch grid needs no attention mask (SigLIP 2's pixel_attention_mask is all ones
for it); NaFlex inputs (naflex/model.py) pass their padding mask.
Shapes in comments: B batch, T tokens, D width, h heads, d head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vit_deploy.runtime.config import ViTConfig


class MAPHead(nn.Module):
    """Tokens (B, T, D) -> pooled (B, D). `mlp` is the model's own MLP block (same width
    and activation as the encoder's)."""

    def __init__(self, cfg: ViTConfig, mlp: nn.Module):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.probe = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.q = nn.Linear(cfg.width, cfg.width)  # nn.MultiheadAttention's in_proj, split
        self.kv = nn.Linear(cfg.width, 2 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask` (B, 1, 1, T): added to every token's logit (a large negative for padding)."""
        B, T, D = x.shape
        q = self.q(self.probe).view(1, 1, self.heads, self.head_dim).transpose(1, 2)  # (1, h, 1, d)
        kv = self.kv(x).view(B, T, 2 * self.heads, self.head_dim).transpose(1, 2)  # (B, 2h, T, d)
        k, v = kv.split(self.heads, dim=1)  # 2 × (B, h, T, d)
        out = F.scaled_dot_product_attention(q.expand(B, -1, -1, -1), k, v,
                                             attn_mask=mask)  # (B, h, 1, d)
        out = self.proj(out.transpose(1, 2).reshape(B, 1, D))  # (B, 1, D)
        out = out + self.mlp(self.norm(out))
        return out[:, 0]  # (B, D)
