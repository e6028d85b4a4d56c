"""Position embeddings and their resampling to the runtime patch grid.

The tables (learned, factorized, frozen at one grid) and `resample_pos_embed`, the pure
function the learned and factorized tables call in every forward (no shape-dependent
branch: an exact identity at the native grid).
Shapes in comments: gh0/gw0 native grid (N0 cells), gh/gw runtime grid (N = gh*gw cells),
K prefix tokens with a position row, D width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vit_deploy.runtime.config import ViTConfig


def resample_pos_embed(table: torch.Tensor, grid_hw: tuple, *, mode: str = "bicubic",
                       antialias: bool = False) -> torch.Tensor:
    """Resample a grid of position vectors (1, gh0, gw0, D) to (1, gh, gw, D).

    Pure function, no shape-dependent branch: it always interpolates, and with
    align_corners=False the cubic/linear weights at scale 1 are exactly (0, 1, 0, 0),
    so the native grid comes back unchanged. Runs inside the exported graph, so one model
    accepts any grid. Without antialias, bicubic / bilinear are separable: two small
    products with the 1-D weight matrices (interp_matrix), the same numbers as
    F.interpolate on the table without ONNX Runtime's CPU Resize over all D channels
    (measured: 97 of 445 ms of a ViT-B/16 int8 run at 448). With antialias (timm, DINOv2
    with registers) F.interpolate itself (ONNX Resize): the basis trick did not reproduce it.
    """
    if antialias:
        grid = table.permute(0, 3, 1, 2)  # (1, D, gh0, gw0)
        grid = F.interpolate(grid, size=(grid_hw[0], grid_hw[1]), mode=mode,
                             align_corners=False, antialias=True)  # (1, D, gh, gw)
        return grid.permute(0, 2, 3, 1)  # (1, gh, gw, D)
    rows = interp_matrix(grid_hw[0], table.shape[1], mode=mode, dtype=table.dtype)  # (gh, gh0)
    cols = interp_matrix(grid_hw[1], table.shape[2], mode=mode, dtype=table.dtype)  # (gw, gw0)
    out = torch.einsum("ha,nabd->nhbd", rows, table)  # (1, gh, gw0, D)
    return torch.einsum("wb,nhbd->nhwd", cols, out)  # (1, gh, gw, D)


def interp_matrix(n_out: int, n_in: int, *, mode: str, dtype: torch.dtype) -> torch.Tensor:
    """(n_out, n_in): F.interpolate's 1-D weights (align_corners=False, no antialias), read
    off by resizing the n_in basis vectors (a Resize over n_in channels of length n_in:
    cheap at any n_out)."""
    basis = torch.eye(n_in, dtype=dtype)[None, :, :, None]  # (1, n_in, n_in, 1)
    resized = F.interpolate(basis, size=(n_out, 1), mode=mode,
                            align_corners=False)  # (1, n_in, n_out, 1)
    return resized[0, :, :, 0].transpose(0, 1)  # (n_out, n_in)


class LearnedPosEmbed(nn.Module):
    """One vector per native grid cell (+ one per positioned prefix token), timm layout
    (1, K + N0, D)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.grid = cfg.grid_size
        self.prefix = cfg.num_pos_prefix
        n = self.grid[0] * self.grid[1]
        self.pos_embed = nn.Parameter(torch.randn(1, self.prefix + n, cfg.width) * 0.02)
        self.mode, self.antialias = cfg.pos_interp, cfg.pos_antialias

    def forward(self, grid_hw: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (prefix positions (1, prefix, D), patch positions (1, N, D))."""
        prefix, cells = self.pos_embed[:, : self.prefix], self.pos_embed[:, self.prefix:]
        table = cells.reshape(1, self.grid[0], self.grid[1], -1)  # (1, gh0, gw0, D)
        table = resample_pos_embed(table, grid_hw, mode=self.mode, antialias=self.antialias)
        return prefix, table.flatten(1, 2)  # (1, N, D)


class FactorizedPosEmbed(nn.Module):
    """A row table and a column table; cell (i, j) gets row[i] + col[j].

    Each table is resampled along its own axis when the grid changes.
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        gh, gw = cfg.grid_size
        self.pos_row = nn.Parameter(torch.randn(1, gh, cfg.width) * 0.02)
        self.pos_col = nn.Parameter(torch.randn(1, gw, cfg.width) * 0.02)
        self.pos_prefix = nn.Parameter(torch.randn(1, cfg.num_pos_prefix, cfg.width) * 0.02)
        self.mode, self.antialias = cfg.pos_interp, cfg.pos_antialias

    def forward(self, grid_hw: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        kw = dict(mode=self.mode, antialias=self.antialias)
        rows = resample_pos_embed(self.pos_row[:, :, None], (grid_hw[0], 1), **kw)  # (1, gh, 1, D)
        cols = resample_pos_embed(self.pos_col[:, None], (1, grid_hw[1]), **kw)  # (1, 1, gw, D)
        return self.pos_prefix, (rows + cols).flatten(1, 2)  # (1, N, D)


class FixedPosEmbed(nn.Module):
    """Position table frozen at one grid (static export: a constant, no Resize)."""

    def __init__(self, prefix: torch.Tensor, cells: torch.Tensor, grid_hw: tuple[int, int]):
        super().__init__()
        self.grid = grid_hw
        self.register_buffer("prefix", prefix.detach().clone())
        self.register_buffer("cells", cells.detach().clone())

    def forward(self, grid_hw: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        if (int(grid_hw[0]), int(grid_hw[1])) != self.grid:
            raise ValueError(f"this model is frozen at grid {self.grid}, got {tuple(grid_hw)}")
        return self.prefix, self.cells

