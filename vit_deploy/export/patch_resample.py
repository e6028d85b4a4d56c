"""FlexiViT's PI-resize: a patch-embedding kernel resampled to another patch size.

Shapes: D width, C channels, p / ph / pw the kernel's (patch) size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pi_resize_matrix(old: tuple[int, int], new: tuple[int, int], *, mode: str = "bicubic",
                     antialias: bool = True) -> torch.Tensor:
    """The linear map B (new_h·new_w, old_h·old_w) that resizes a flattened old-size patch
    to the new size (F.interpolate on each basis patch; float64)."""
    n = old[0] * old[1]
    basis = torch.eye(n, dtype=torch.float64).reshape(n, 1, *old)
    resized = F.interpolate(basis, size=new, mode=mode, antialias=antialias, align_corners=False)
    return resized.reshape(n, -1).T


def resample_patch_embed(weight: torch.Tensor, new: tuple[int, int], *, mode: str = "bicubic",
                         antialias: bool = True) -> torch.Tensor:
    """FlexiViT's pseudo-inverse resize (PI-resize) of a patch-embedding kernel
    (D, C, p, p) -> (D, C, new_h, new_w): w' = pinv(Bᵀ) w, so that <B x, w'> = <x, w> for
    every old-size patch x when the kernel grows (exact), and in the least-squares sense
    when it shrinks. timm's `resample_patch_embed` uses the same construction; bicubic with
    antialias is its default. Differentiable in `weight` (flexible training)."""
    D, C, ph, pw = weight.shape
    if (ph, pw) == tuple(new):
        return weight
    B = pi_resize_matrix((ph, pw), tuple(new), mode=mode, antialias=antialias)
    pinv = torch.linalg.pinv(B.T).to(weight.dtype)  # (new², old²)
    return (weight.reshape(D * C, ph * pw) @ pinv.T).reshape(D, C, *new)
