"""Token merging (ToMe, Bolya et al. 2023) as its reference code does it
(facebookresearch/ToMe, `tome/merge.py` with the timm patch): bipartite matching over all
tokens and the size-weighted merge.

Shapes: B batch, T tokens (K prefix + patches), d head dim, r tokens merged.
Proportional attention (log size on every key's logit) lives in model.Attention.
"""

from __future__ import annotations

import torch


def merge_count(r: int, tokens, prefix: int):
    """How many tokens a block asked for r merges: the reference's clamp,
    min(r, (T - protected) // 2), so any input size runs (small grids merge fewer)."""
    if isinstance(tokens, int):
        return min(r, (tokens - prefix) // 2)
    # Under torch.export: computed as a tensor and read back as a fresh symbol u, so the
    # next block's token count is T - u (linear). torch.sym_min would nest Min(...) in
    # every later size, twice per block: 6 blocks took 4 minutes to export.
    room = torch.scalar_tensor((tokens - prefix) // 2, dtype=torch.int64)
    u = torch.clamp(room, max=r).item()
    torch._check(u >= 0)
    torch._check(u <= r)
    torch._check(2 * u <= tokens - prefix)
    return u


def bipartite_soft_matching(metric: torch.Tensor, r: int, prefix: int
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ToMe's matching on one block's tokens, as the reference implementation orders them.

    metric (B, T, d): each token's key (averaged over heads). *All* T tokens alternate
    into sets A (even indices) and B (odd), prefix tokens included; a prefix token in A
    never merges (its scores are -inf: the reference's class token) and one in B never
    receives (its column is -inf: the reference's distillation token). Each A token finds
    its most similar B token (cosine); the r' = merge_count(r, T, prefix) best-matched A
    tokens merge into their partners. Survivors are ordered as the reference's
    concatenation: prefix tokens, the unmerged A tokens (by index; without prefix tokens,
    by descending score, the reference's argsort order), then every B token by index. The
    next block's A / B split depends on that order.

    Returns token indices: merged A tokens (B, r'), their B partners (B, r'), and the order
    of the T - r' survivors (B, T - r'). One gather with that order builds the next
    block's tokens, so the exporter's token count stays T - r' (no ceil / floor halves).
    """
    B, T, _ = metric.shape
    r = merge_count(r, T, prefix)
    m = metric / metric.norm(dim=-1, keepdim=True)
    a, b = m[:, 0::2], m[:, 1::2]  # (B, ceil(T/2), d), (B, floor(T/2), d)
    scores = a @ b.transpose(1, 2)  # (B, Na, Nb)
    if prefix:  # prefix tokens 0, 2, ... are A's first rows; 1, 3, ... B's first columns
        rows = torch.arange(scores.shape[1], device=m.device)[:, None] < (prefix + 1) // 2
        cols = torch.arange(scores.shape[2], device=m.device)[None, :] < prefix // 2
        scores = scores.masked_fill(rows | cols, -torch.inf)
    # One more column of -inf: a row is never empty (T = 1 has no B token; r' is 0 then)
    scores = torch.cat([scores, torch.full_like(a[..., :1], -torch.inf)], dim=-1)  # (B, Na, Nb + 1)
    best, partner = scores.max(dim=-1)  # (B, Na): each A token's best B token
    src = best.topk(r, dim=-1).indices  # (B, r) the best-matched A tokens merge ...
    dst = partner.gather(1, src)  # (B, r) ... into their partners
    src, dst = 2 * src, 2 * dst + 1  # as token indices

    # The survivors' order as one sort key per token (ascending), merged tokens last.
    t = torch.arange(T, device=m.device)  # (T,)
    odd = (t % 2).bool()
    tf = t.to(m.dtype)
    if prefix:  # prefix (t - T < 0), then A by index (t), then B by index (T + t)
        key = torch.where(t < prefix, tf - T, torch.where(odd, tf + T, tf))[None]
    else:  # A by descending score (-best in [-1, 1]), then B by index (2 + t)
        a_key = -best.gather(1, (t // 2)[None].expand(B, -1))  # (B, T): A token t//2's score
        key = torch.where(odd, 2 + tf, a_key)
    key = key.expand(B, -1).scatter(1, src, torch.inf)  # (B, T)
    order = key.topk(T - r, dim=-1, largest=False).indices  # (B, T - r) ascending keys
    return src, dst, order


def merge_tokens(x: torch.Tensor, size: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                 order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Size-weighted average of each merged group, survivors in `order`: x (B, T, D),
    size (B, T, 1) -> (B, T - r, D), (B, T - r, 1)."""
    def merge(t: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T - r, C), summed
        C = t.shape[-1]
        moved = t.gather(1, src[..., None].expand(-1, -1, C))  # (B, r, C)
        t = t.scatter_add(1, dst[..., None].expand(-1, -1, C), moved)  # (B, T, C)
        return t.gather(1, order[..., None].expand(-1, -1, C))

    total = merge(x * size)
    size = merge(size)
    return total / size, size
