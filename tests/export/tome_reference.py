"""A test oracle for token merging: ToMe as its reference code does it (facebookresearch/ToMe,
`tome/merge.py` and `tome/patches/timm.py`, `tome.patch.timm(model, prop_attn=True)` with a
constant r), written out plainly from that algorithm's rules, one token at a time. It
shares nothing with vit_deploy/export/token_merge.py (no vectorised matching, no sort keys,
no gathers); it uses our model only for its weights, its embedding and its head.

Rules, per block (after attention, before the MLP):
- r' = min(r, (T - protected) // 2), protected = the prefix tokens; nothing when r' = 0.
- All T tokens alternate into A (even indices) and B (odd), the prefix tokens included.
  A prefix token in A never merges (the reference sets the class token's scores to -inf);
  one in B never receives (it sets the distillation token's column to -inf).
- Each A token's score is its best cosine to a B token (of the attention keys averaged
  over heads); the r' A tokens of highest score merge into their best B token.
- Merging sums x·size and size into the B token, then divides: a size-weighted mean.
- The survivors are the unmerged A tokens, then every B token. With prefix tokens the
  unmerged A tokens are in index order (the reference sorts them so the class token stays
  first; with a distillation token it concatenates [cls, dist, other A, other B]); without
  any they stay in descending-score order (the reference's argsort).
- Attention is proportional: log(size) is added to every key's logit (size: the patches a
  token stands for, None before the first merge).

Registers are not in the reference (its timm patch knows the class and distillation tokens
only); the oracle treats every prefix token like the class token (A) or the distillation
token (B), which is what vit-deploy does.

Validated against the real reference once, with scripts/tome_reference_check.py (see
tests/export/test_tome.py's docstring for the figures).
"""

from __future__ import annotations

import torch


def reference_forward(model, x: torch.Tensor, merge: tuple[int, ...]) -> torch.Tensor:
    """Logits of `model` (a vit_deploy ViT; its own merge setting is ignored) with ToMe
    merging merge[l] tokens in block l, the reference's way. x (B, C, H, W) -> (B, K)."""
    cfg = model.cfg
    with torch.no_grad():
        tokens, size = model.embed(x), None  # (B, T, D), prefix first
        for block, r in zip(model.blocks, merge):
            tokens, size = reference_block(block, tokens, size, r, cfg.num_prefix_tokens)
        return model.forward_head(model.norm(tokens), size=size)


def reference_block(block, x: torch.Tensor, size: torch.Tensor | None, r: int, prefix: int):
    """One block: x (B, T, D), size (B, T, 1) or None -> the same after merging."""
    B, T, D = x.shape
    attn = block.attn
    H, d = attn.heads, attn.head_dim
    qkv = attn.qkv(block.norm1(x)).reshape(B, T, 3, H, d).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]  # (B, H, T, d)
    logits = q @ k.transpose(-2, -1) * d ** -0.5  # (B, H, T, T)
    if size is not None:
        logits = logits + size.log()[:, None, None, :, 0]
    out = (logits.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
    x = x + block.ls1(attn.proj(out))
    r = min(r, (T - prefix) // 2)
    if r > 0:
        size = torch.ones_like(x[..., :1]) if size is None else size
        keys = k.mean(dim=1)  # (B, T, d)
        merged = [merge_one_image(x[i], size[i], keys[i], r, prefix) for i in range(B)]
        x = torch.stack([m[0] for m in merged])
        size = torch.stack([m[1] for m in merged])
    return x + block.ls2(block.mlp(block.norm2(x))), size


def merge_one_image(x: torch.Tensor, size: torch.Tensor, keys: torch.Tensor, r: int,
                    prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (T, D), size (T, 1), keys (T, d) -> x (T - r, D), size (T - r, 1)."""
    T = x.shape[0]
    unit = [keys[t] / keys[t].norm() for t in range(T)]
    set_a, set_b = list(range(0, T, 2)), list(range(1, T, 2))
    score, partner = {}, {}
    for a in set_a:
        score[a], partner[a] = -float("inf"), None
        if a < prefix:  # a prefix token in A never merges
            continue
        for b in set_b:
            if b < prefix:  # a prefix token in B never receives
                continue
            s = float(unit[a] @ unit[b])
            if s > score[a]:  # the first of equal scores, as torch.max
                score[a], partner[a] = s, b
    ranked = sorted(set_a, key=lambda a: -score[a])  # highest score first (stable)
    merging, unmerged = ranked[:r], ranked[r:]
    if prefix:
        unmerged = sorted(unmerged)
    total = {t: x[t] * size[t] for t in range(T)}
    count = {t: size[t] for t in range(T)}
    for a in merging:
        b = partner[a]
        total[b] = total[b] + total[a]
        count[b] = count[b] + count[a]
    order = ([t for t in range(prefix)] + [a for a in unmerged if a >= prefix]
             + [b for b in set_b if b >= prefix])
    return (torch.stack([total[t] / count[t] for t in order]),
            torch.stack([count[t] for t in order]))
