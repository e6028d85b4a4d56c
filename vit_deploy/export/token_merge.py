"""Token merging (ToMe, Bolya et al. 2023): bipartite matching and the size-weighted merge.

Shapes: B batch, T = prefix + N tokens, N patch tokens, d head dim, r tokens merged.
Proportional attention (log size on every key's logit) lives in model.Attention.
"""

from __future__ import annotations

import torch


def bipartite_soft_matching(metric: torch.Tensor, r: int, prefix: int
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ToMe's matching (Bolya et al. 2023, Algorithm 1) on the patch tokens of one block.

    metric (B, T, d): each token's key. Prefix tokens (class, distillation, registers)
    take no part. The N patches alternate into sets A (even) and B (odd); each A token
    finds its most similar B token (cosine); the r best-matched A tokens are merged into
    their B partners. Returns, as indices into the N patches: the merged A tokens (B, r),
    their B partners (B, r), and the N - r survivors in raster order (B, N - r).

    Exportable with dynamic shapes: ArgMax, TopK, GatherElements, ScatterElements; the
    token count after the block is N - r, a linear expression (needs N >= 2r: see
    ViTConfig.min_patches).
    """
    m = metric[:, prefix:]  # (B, N, d)
    m = m / m.norm(dim=-1, keepdim=True)
    a, b = m[:, 0::2], m[:, 1::2]  # (B, Na, d), (B, Nb, d): A even patches, B odd ones
    best, partner = (a @ b.transpose(1, 2)).max(dim=-1)  # (B, Na): each A token's best match
    src = best.topk(r, dim=-1).indices  # (B, r) the best-matched A tokens merge
    dst = partner.gather(1, src)  # (B, r) into their partners
    src, dst = 2 * src, 2 * dst + 1  # as indices into the N patches
    # Survivors: every patch but the merged ones, in raster order. Their count N - r does
    # not depend on the A / B split, so the exporter's symbolic sizes stay linear block
    # after block (N - r1 - r2 ...), not nested ceil / floor halves.
    N = m.shape[1]
    position = torch.arange(N, device=m.device).to(m.dtype)[None]  # (1, N)
    merged = torch.zeros_like(m[..., 0]).scatter(1, src, 1.0)  # (B, N)
    keep = (-(position + merged * N)).topk(N - r, dim=-1).indices  # (B, N - r) ascending
    return src, dst, keep


def merge_tokens(x: torch.Tensor, size: torch.Tensor, prefix: int, src: torch.Tensor,
                 dst: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Size-weighted average of each merged group: x (B, T, D), size (B, T, 1) ->
    (B, T - r, D), (B, T - r, 1). Prefix tokens stay first and untouched; the surviving
    patch tokens keep their raster order."""
    def merge(t: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T - r, C), summed
        C = t.shape[-1]
        pre, patches = t[:, :prefix], t[:, prefix:]
        moved = patches.gather(1, src[..., None].expand(-1, -1, C))  # (B, r, C)
        patches = patches.scatter_add(1, dst[..., None].expand(-1, -1, C), moved)
        return torch.cat([pre, patches.gather(1, keep[..., None].expand(-1, -1, C))], dim=1)

    total = merge(x * size)
    size = merge(size)
    return total / size, size
