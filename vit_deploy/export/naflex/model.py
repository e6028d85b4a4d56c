"""SigLIP 2 NaFlex: the reference model on transformers' native-aspect inputs, and its
ONNX export (one graph: dynamic batch and number of patches, any mix of aspect ratios).

Inputs are what Siglip2ImageProcessor makes (runtime/naflex/preprocess.py makes the same without
torch): patches flattened (row, column, channel) and padded to N, a mask of the real ones,
and each image's patch grid (gh, gw). The position table is resized per image inside the
graph as transformers' Siglip2VisionEmbeddings.resize_positional_embeddings does: bilinear
with antialias is separable and linear, so each image's resized table is one product,
(W_rows ⊙ W_cols) @ table, with the 1-D triangle-filter weights computed from
spatial_shapes (plain arithmetic: no Loop, no per-image Resize). Padding is masked in
every attention and in the attention-pooling head.
Shapes in comments: B batch, N max_num_patches, P patch, C channels, D width,
gh0/gw0 the table's grid (N0 = gh0*gw0 rows), gh/gw an image's grid.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F
from torch import nn

from vit_deploy.export.model import ViT
from vit_deploy.export.onnx import ExportError, _quiet, finalize, validate_onnx
from vit_deploy.export.pos_embed import LearnedPosEmbed
from vit_deploy.runtime.contract import OPSET
from vit_deploy.runtime.files import write_bytes_atomic
from vit_deploy.runtime.naflex.contract import (BATCH_DIM, METADATA_NAFLEX_KEY, NAFLEX_INPUTS,
                                                NAFLEX_OUTPUTS, PATCHES_DIM)

# Trace with batch 2 and a prime number of patches (nobody's grid), two images of different
# aspect ratios, one padded: nothing specialises on a size.
TRACE_BATCH, TRACE_PATCHES, TRACE_GRIDS = 2, 37, ((5, 7), (3, 12))


def axis_weights(center: torch.Tensor, support: torch.Tensor, n_in: int) -> torch.Tensor:
    """Triangle-filter weights along one axis, as F.interpolate(mode="bilinear",
    align_corners=False, antialias=True) uses them: center (B, N) source coordinates,
    support (B, 1) max(1, n_in / n_out) -> (B, N, n_in), each row summing to 1."""
    source = torch.arange(n_in, dtype=torch.float32, device=center.device)  # (n_in,)
    w = (1 - (source - center[..., None]).abs() / support[..., None]).clamp(min=0)
    return w / w.sum(-1, keepdim=True)


def naflex_pos_weights(grid_hw: tuple[int, int], spatial_shapes: torch.Tensor, n: int, *,
                       antialias: bool = True) -> torch.Tensor:
    """(B, N, N0): row i of image b holds the weights of every table cell for its i-th
    position on its own (gh, gw) grid (raster order); padding rows (i >= gh*gw) take cell
    (0, 0)'s, as transformers does. Pure function of the shapes' values: no Python branch
    on them, so one graph serves every grid. Without antialias: plain bilinear."""
    sizes = spatial_shapes.to(torch.float32)[:, None]  # (B, 1, 2): gh, gw
    positions = torch.arange(n, dtype=torch.float32,
                             device=sizes.device)[None, :, None]  # (1, N, 1)
    rows = torch.div(positions, sizes[..., 1:], rounding_mode="floor")  # (B, N, 1)
    index = torch.cat([rows, positions - rows * sizes[..., 1:]], dim=-1)  # (B, N, 2)
    index = index * (positions < sizes.prod(-1, keepdim=True))  # padding -> (0, 0)
    grid = torch.tensor(grid_hw, dtype=torch.float32, device=sizes.device)  # (2,)
    scale = grid / sizes  # (B, 1, 2)
    support = scale.clamp(min=1) if antialias else torch.ones_like(scale)
    center = (index + 0.5) * scale - 0.5  # (B, N, 2) source coordinates
    w_rows = axis_weights(center[..., 0], support[..., 0], grid_hw[0])  # (B, N, gh0)
    w_cols = axis_weights(center[..., 1], support[..., 1], grid_hw[1])  # (B, N, gw0)
    return (w_rows[..., :, None] * w_cols[..., None, :]).flatten(-2)  # (B, N, N0)


def patch_linear_weight(conv_weight: torch.Tensor) -> torch.Tensor:
    """The patch convolution (D, C, P, P) as SigLIP 2's Linear over patches flattened
    (row, column, channel): (D, P*P*C)."""
    return conv_weight.permute(0, 2, 3, 1).reshape(conv_weight.shape[0], -1)


def padding_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, N) 1 real / 0 padding -> (B, 1, 1, N) added to attention logits: 0 for real
    tokens, the dtype's lowest value for padding (transformers' convention)."""
    keep = mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, N)
    return torch.where(keep, torch.zeros((), dtype=dtype),
                       torch.full((), torch.finfo(dtype).min, dtype=dtype))


class NaFlexViT(nn.Module):
    """A ViT (SigLIP 2 tower: learned table, no prefix tokens) on NaFlex inputs.

    forward(pixel_values (B, N, P*P*C), pixel_attention_mask (B, N), spatial_shapes (B, 2))
    -> (pooled (B, D), last_hidden_state (B, N, D)); rows of padding are not meaningful."""

    def __init__(self, vit: ViT):
        super().__init__()
        cfg = vit.cfg
        problems = [why for bad, why in (
            (not isinstance(vit.pos, LearnedPosEmbed),
             f"pos_embed 'learned' (got {cfg.pos_embed!r})"),
            (cfg.num_prefix_tokens != 0, f"no prefix tokens (got {cfg.num_prefix_tokens})"),
            (cfg.merging, "no token merging"),
            (cfg.pool not in ("map", "mean"), f"pool 'map' or 'mean' (got {cfg.pool!r})"),
            (cfg.pos_interp != "bilinear", f"pos_interp 'bilinear' (got {cfg.pos_interp!r})"),
            (cfg.num_classes != 0, f"no classifier (got num_classes {cfg.num_classes})"),
        ) if bad]
        if problems:
            raise ValueError(f"NaFlex needs a SigLIP 2 style tower: expected {', '.join(problems)}")
        self.vit = vit

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor,
                spatial_shapes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        vit, cfg = self.vit, self.vit.cfg
        proj = vit.patch_embed.proj
        x = F.linear(pixel_values, patch_linear_weight(proj.weight), proj.bias)  # (B, N, D)
        table = vit.pos.pos_embed[0]  # (N0, D): no prefix rows
        weights = naflex_pos_weights(cfg.grid_size, spatial_shapes, pixel_values.shape[1],
                                     antialias=cfg.pos_antialias)  # (B, N, N0)
        x = vit.pre_norm(x + weights @ table)  # (B, N, D)
        bias = padding_bias(pixel_attention_mask, x.dtype)  # (B, 1, 1, N)
        for block in vit.blocks:
            x, _ = block(x, mask=bias)
        x = vit.norm(x)  # (B, N, D)
        if vit.map_head is not None:
            pooled = vit.map_head(x, bias)  # (B, D)
        else:  # mean over the real tokens
            m = pixel_attention_mask.to(x.dtype)[..., None]  # (B, N, 1)
            pooled = (x * m).sum(1) / m.sum(1)  # (B, D)
        return vit.proj(vit.fc_norm(pooled)), x


def example_inputs(cfg, *, batch: int = TRACE_BATCH, patches: int = TRACE_PATCHES,
                   grids=TRACE_GRIDS, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(pixel_values, pixel_attention_mask int32, spatial_shapes int64) with random
    patches, each image's real patches first, the rest zero and masked."""
    if len(grids) != batch or any(h * w > patches for h, w in grids):
        raise ValueError(f"expected {batch} grids of at most {patches} patches, got {grids}")
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch, patches, cfg.in_chans * cfg.patch_size ** 2, generator=g)
    mask = torch.zeros(batch, patches, dtype=torch.int32)
    for i, (h, w) in enumerate(grids):
        mask[i, :h * w] = 1
    return values * mask[..., None], mask, torch.tensor(grids, dtype=torch.int64)


def export_naflex_onnx(model: ViT, dst: str | Path, *, opset: int = OPSET) -> Path:
    """Export `model` in NaFlex mode to `dst` (written atomically); returns `dst`.
    Inputs and outputs are runtime/naflex/preprocess.py's NAFLEX_INPUTS / NAFLEX_OUTPUTS, dims
    (batch, num_patches) dynamic."""
    if opset < 18:
        raise ValueError(f"opset must be >= 18, got {opset}")
    module = NaFlexViT(model.eval()).eval()
    batch, n = torch.export.Dim("batch", min=1), torch.export.Dim("num_patches", min=1)
    dynamic = {"pixel_values": {0: batch, 1: n}, "pixel_attention_mask": {0: batch, 1: n},
               "spatial_shapes": {0: batch}}
    try:
        with _quiet(), torch.no_grad():
            program = torch.onnx.export(
                module, example_inputs(model.cfg), dynamo=True, input_names=list(NAFLEX_INPUTS),
                output_names=list(NAFLEX_OUTPUTS), dynamic_shapes=dynamic,
                opset_version=opset, verbose=False, optimize=True)
    except Exception as e:  # the exporter raises many types; keep the message
        raise ExportError(f"torch.onnx.export failed for {model.cfg.name or 'model'} "
                          f"(NaFlex): {e}") from e
    proto = program.model_proto
    _finalize(proto, config_json=model.cfg.to_json())
    return write_bytes_atomic(dst, validate_onnx(proto))


def _finalize(proto: onnx.ModelProto, *, config_json: str) -> None:
    """The common finish (onnx.finalize) with NaFlex's dims (batch, num_patches) and its
    marker in the metadata."""
    dims = proto.graph.input[0].type.tensor_type.shape.dim  # pixel_values (B, N, P*P*C)
    finalize(proto, config_json=config_json,
             renames={dims[0].dim_param: BATCH_DIM, dims[1].dim_param: PATCHES_DIM},
             metadata={METADATA_NAFLEX_KEY: json.dumps({"inputs": list(NAFLEX_INPUTS),
                                                        "outputs": list(NAFLEX_OUTPUTS)})})
