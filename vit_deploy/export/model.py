"""Reference Vision Transformer (pre-norm), built from a ViTConfig.

Its parts with a concept of their own live beside it: position embeddings and their
resampling (pos_embed.py), 2-D rotary positions (rope.py), attention pooling (map_head.py),
the MLP, plain or gated (mlp.py), FlexiViT's patch-kernel resize (patch_resample.py), token
merging (token_merge.py).

Shapes in comments: B batch, C channels, H/W pixels, P patch, gh/gw patch grid,
N = gh*gw patch tokens, T = prefix + N tokens, D width, h heads, d head dim.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.export.map_head import MAPHead
from vit_deploy.export.mlp import MLP
from vit_deploy.export.patch_resample import resample_patch_embed
from vit_deploy.export.pos_embed import (FactorizedPosEmbed, FixedPosEmbed, LearnedPosEmbed,
                                         resample_pos_embed)
from vit_deploy.export.rope import RotaryPosEmbed, apply_rope
from vit_deploy.export.token_merge import bipartite_soft_matching, merge_tokens
from vit_deploy.outputs import OutputSelection, block_of
from vit_deploy.runtime.sizes import require_patch_multiple


class PatchEmbed(nn.Module):
    """Stride-P convolution: the same linear map applied to every flattened P×P patch."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.patch_size = cfg.patch_size
        self.proj = nn.Conv2d(cfg.in_chans, cfg.width, cfg.patch_size, stride=cfg.patch_size,
                              bias=cfg.patch_bias)

    def forward(self, x: torch.Tensor, patch: int | None = None) -> torch.Tensor:
        """`patch` other than the model's: the kernel PI-resized to it (FlexiViT training)."""
        if patch is None or patch == self.patch_size:
            x = self.proj(x)  # (B, D, gh, gw)
        else:
            w = resample_patch_embed(self.proj.weight, (patch, patch))
            x = F.conv2d(x, w, self.proj.bias, stride=patch)
        return x.flatten(2).transpose(1, 2)  # (B, N, D), raster order


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection; batch stays separate."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=cfg.qkv_bias)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor, size: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> (output (B, T, D), keys averaged over heads (B, T, d)).

        `size` (B, T, 1): how many patches each token stands for after merging; ToMe's
        proportional attention adds log(size) to every key's logit. `rope`: (cos, sin)
        (1, 1, T, d) rotating queries and keys (DINOv3). `mask` (B, 1, 1, T): added to every
        key's logit (0 for real tokens, a large negative for padding: NaFlex, naflex/model.py)."""
        B, T, D = x.shape
        # One 4-D transpose and a Split: measured 2 % faster in ORT (int8) than the
        # 5-D permute + unbind, which exports as 3 Slice + 3 Squeeze per block.
        qkv = self.qkv(x).view(B, T, 3 * self.heads, self.head_dim).transpose(1, 2)  # (B, 3h, T, d)
        q, k, v = qkv.split(self.heads, dim=1)  # 3 × (B, h, T, d)
        if rope is not None:
            q, k = apply_rope(q, k, *rope)
        metric = k.mean(dim=1)  # (B, T, d)
        if size is None:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, h, T, d)
        else:  # log(size) added to every key's logit, folded into the product: one more
            # dimension, q' = [q, √d], k' = [k, log size], so q'·k'/√d = q·k/√d + log size
            # (no (T, T) bias tensor to add: measured 21 ms of 359 at 448 on ViT-B/16 int8)
            d = self.head_dim
            root = torch.full_like(q[..., :1], d ** 0.5)  # (B, h, T, 1)
            bias = size.log()[:, None].expand(-1, self.heads, -1, -1)  # (B, h, T, 1)
            x = F.scaled_dot_product_attention(torch.cat([q, root], -1), torch.cat([k, bias], -1),
                                               v, attn_mask=mask, scale=d ** -0.5)  # (B, h, T, d)
        return self.proj(x.transpose(1, 2).reshape(B, T, D)), metric


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (CaiT / DeiT-3 / DINOv2), timm name `gamma`."""

    def __init__(self, width: int, init: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((width,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm encoder block: x + MHA(LN(x)), then x + MLP(LN(x)) (each branch optionally
    layer-scaled). With `merge` r > 0, ToMe merges up to r tokens between the two (fewer
    where the block has fewer than 2r + prefix tokens: token_merge.merge_count)."""

    def __init__(self, cfg: ViTConfig, merge: int = 0):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ls1 = LayerScale(cfg.width) if cfg.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.ls2 = LayerScale(cfg.width) if cfg.layer_scale else nn.Identity()
        self.merge, self.prefix = merge, cfg.num_prefix_tokens

    def forward(self, x: torch.Tensor, size: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, D), size (B, T, 1) or None (nothing merged yet) -> the same, T - r'.
        `mask` (B, 1, 1, T): Attention's padding mask (never with merging)."""
        out, metric = self.attn(self.norm1(x), size, rope, mask)
        x = x + self.ls1(out)
        if self.merge:
            if size is None:
                size = torch.ones_like(x[..., :1])  # (B, T, 1)
            x, size = merge_tokens(x, size,
                                   *bipartite_soft_matching(metric, self.merge, self.prefix))
        return x + self.ls2(self.mlp(self.norm2(x))), size


class Tokens(NamedTuple):
    normed: torch.Tensor  # (B, T, D) after the final norm
    layers: list[torch.Tensor]  # (B, T, D) after each requested block, raw
    size: torch.Tensor | None  # (B, T, 1) patches per token; None: nothing merged


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.width)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, cfg.width)) if cfg.dist_token else None
        self.reg_token = (nn.Parameter(torch.zeros(1, cfg.num_registers, cfg.width))
                          if cfg.num_registers else None)
        self.pos = {"learned": LearnedPosEmbed, "factorized": FactorizedPosEmbed,
                    "rope": RotaryPosEmbed}[cfg.pos_embed](cfg)
        self.pre_norm = nn.LayerNorm(cfg.width, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()
        self.blocks = nn.ModuleList(Block(cfg, r) for r in (cfg.merge or (0,) * cfg.depth))
        norm = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)
        self.norm = nn.Identity() if cfg.fc_norm else norm
        self.fc_norm = norm if cfg.fc_norm else nn.Identity()
        self.map_head = MAPHead(cfg, MLP(cfg)) if cfg.pool == "map" else None
        self.proj = nn.Linear(cfg.width, cfg.proj_dim, bias=False) if cfg.proj_dim else nn.Identity()
        self.head = nn.Linear(cfg.pooled_dim, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.head_dist = (nn.Linear(cfg.width, cfg.num_classes)
                          if cfg.dist_token and cfg.dist_head and cfg.num_classes else None)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias) if m.bias is not None else None
        for token in (self.cls_token, self.dist_token, self.reg_token,
                      self.map_head.probe if self.map_head is not None else None):
            if token is not None:
                nn.init.normal_(token, std=1e-6)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> normalised tokens (B, T, D)."""
        return self.forward_tokens(x).normed

    def embed(self, x: torch.Tensor, *, patch: int | None = None) -> torch.Tensor:
        """(B, C, H, W) -> the tokens entering the first block (B, T, D): prefix tokens
        (class, distillation, registers) then the patches in raster order, positions added
        (rotary models: their positions rotate q and k in every block instead), then the
        pre-norm (CLIP; identity elsewhere)."""
        P = patch or self.cfg.patch_size
        H, W = x.shape[-2:]
        if not torch.compiler.is_compiling():  # eager callers get a readable error
            require_patch_multiple(int(H), int(W), P)
        tokens = self.patch_embed(x, patch)  # (B, N, D)
        if isinstance(self.pos, RotaryPosEmbed):
            pos_prefix = tokens[:1, :0]  # (1, 0, D): no position rows
        else:
            pos_prefix, pos_cells = self.pos((H // P, W // P))  # (1, prefix, D), (1, N, D)
            tokens = tokens + pos_cells
        prefix = [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if prefix:
            pre = torch.cat(prefix, dim=1)  # (1, prefix, D): cls, dist, registers
            k = pos_prefix.shape[1]  # the first k of them have a position row
            pre = torch.cat([pre[:, :k] + pos_prefix, pre[:, k:]], dim=1)
            tokens = torch.cat([pre.expand(tokens.shape[0], -1, -1), tokens], dim=1)  # (B, T, D)
        return self.pre_norm(tokens)

    def forward_tokens(self, x: torch.Tensor, layers: tuple[int, ...] = (), *,
                       patch: int | None = None) -> Tokens:
        """(B, C, H, W) -> normalised tokens (B, T, D), the tokens after each 1-based
        block in `layers` (B, T, D; not normalised), and with token merging the patches
        each token stands for (B, T, 1). `patch`: run at another patch size (FlexiViT)."""
        tokens = self.embed(x, patch=patch)  # (B, T, D)
        P = patch or self.cfg.patch_size
        H, W = x.shape[-2:]
        rope = (self.pos((H // P, W // P)) if isinstance(self.pos, RotaryPosEmbed)
                else None)  # (1, 1, T, d) cos, sin
        kept, size = [], None
        for i, block in enumerate(self.blocks, start=1):
            tokens, size = block(tokens, size, rope)
            if i in layers:
                kept.append(tokens)
        return Tokens(self.norm(tokens), [kept[sorted(layers).index(b)] for b in layers], size)

    def patch_grid(self, tokens: torch.Tensor, grid_hw: tuple) -> torch.Tensor:
        """Tokens (B, T, D) -> the patch tokens on their grid (B, D, gh, gw), prefix
        tokens (class, distillation, registers) dropped."""
        patches = tokens[:, self.cfg.num_prefix_tokens:]  # (B, N, D), raster order
        return patches.transpose(1, 2).reshape(tokens.shape[0], -1, grid_hw[0], grid_hw[1])

    def forward_head(self, tokens: torch.Tensor, *, pre_logits: bool = False,
                     size: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised tokens (B, T, D) -> logits (B, classes), or pooled (B, D). Mean
        pooling after token merging weighs each token by the patches it stands for."""
        K = self.cfg.num_prefix_tokens
        if self.cfg.pool == "cls":
            pooled = tokens[:, 0]  # (B, D)
        elif self.map_head is not None:
            pooled = self.map_head(tokens[:, K:])  # (B, D)
        elif size is None:
            pooled = tokens[:, K:].mean(dim=1)  # (B, D)
        else:
            w = size[:, K:]  # (B, N', 1)
            pooled = (tokens[:, K:] * w).sum(dim=1) / w.sum(dim=1)  # (B, D)
        pooled = self.proj(self.fc_norm(pooled))  # (B, D), or (B, proj_dim) with a projection
        if pre_logits:
            return pooled
        if self.head_dist is not None:  # DeiT: mean of the class and distillation heads
            return (self.head(pooled) + self.head_dist(self.fc_norm(tokens[:, 1]))) / 2
        if self.cfg.head_norm:  # a zero-shot head: cosine to each label's text embedding
            return self.head(F.normalize(pooled, dim=-1))
        return self.head(pooled)

    def forward(self, x: torch.Tensor, *, patch: int | None = None) -> torch.Tensor:
        t = self.forward_tokens(x, patch=patch)
        return self.forward_head(t.normed, size=t.size)

    def with_merging(self, merge: tuple[int, ...]) -> ViT:
        """A copy that merges merge[l] tokens in block l (ToMe; no weights change)."""
        import copy

        out = copy.deepcopy(self)
        out.cfg = self.cfg.replace(merge=tuple(merge))  # validates the schedule
        for block, r in zip(out.blocks, out.cfg.merge or (0,) * len(out.blocks)):
            block.merge = r
        return out

    def with_patch_size(self, patch: int) -> ViT:
        """A copy deployed at another patch size: the kernel PI-resized (FlexiViT), the
        position table resampled to the new native grid (round(native / patch) cells a
        side), everything else shared."""
        cfg = self.cfg
        if patch == cfg.patch_size:
            return self
        grid = tuple(max(1, round(s / patch)) for s in cfg.img_size)
        new_cfg = cfg.replace(patch_size=patch, img_size=(grid[0] * patch, grid[1] * patch),
                              trained_patch_size=cfg.trained_patch_size or cfg.patch_size)
        out = ViT(new_cfg).eval()
        state = {k: v for k, v in self.state_dict().items()
                 if not k.startswith(("patch_embed.", "pos."))}
        with torch.no_grad():
            state["patch_embed.proj.weight"] = resample_patch_embed(
                self.patch_embed.proj.weight.double(), (patch, patch)).float()
            if cfg.patch_bias:
                state["patch_embed.proj.bias"] = self.patch_embed.proj.bias.clone()
            if isinstance(out.pos, RotaryPosEmbed):  # no table: the angles follow the grid
                pass
            elif isinstance(out.pos, LearnedPosEmbed):
                prefix, cells = self.pos(grid)  # (1, K, D), (1, gh * gw, D)
                state["pos.pos_embed"] = torch.cat([prefix, cells], dim=1)
            else:  # factorized: each table along its own axis
                kw = dict(mode=cfg.pos_interp, antialias=cfg.pos_antialias)
                state["pos.pos_row"] = resample_pos_embed(
                    self.pos.pos_row[:, :, None], (grid[0], 1), **kw)[:, :, 0]
                state["pos.pos_col"] = resample_pos_embed(
                    self.pos.pos_col[:, None], (1, grid[1]), **kw)[:, 0]
                state["pos.pos_prefix"] = self.pos.pos_prefix.clone()
        out.load_state_dict(state)
        return out

    def frozen_at(self, height: int, width: int) -> ViT:
        """A copy whose position table is computed once for one input size (static export)."""
        require_patch_multiple(height, width, self.cfg.patch_size)
        grid = (height // self.cfg.patch_size, width // self.cfg.patch_size)
        import copy

        frozen = copy.deepcopy(self)
        if isinstance(self.pos, RotaryPosEmbed):  # no table; fixed shapes fold the angles
            return frozen
        with torch.no_grad():
            prefix, cells = self.pos(grid)
        frozen.pos = FixedPosEmbed(prefix, cells, grid)
        return frozen


class ViTOutputs(nn.Module):
    """Export wrapper: the named outputs of an OutputSelection, in its order (see
    vit_deploy/outputs.py for the names and their shapes)."""

    def __init__(self, vit: ViT, names: tuple[str, ...], *, layer_norm: bool = True):
        super().__init__()
        self.vit, self.names, self.layer_norm = vit, tuple(names), layer_norm
        self.layers = tuple(b for b in map(block_of, self.names) if b is not None)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from vit_deploy.runtime.contract import (CLASS_TOKEN_NAME, FEATURES_NAME, LOGITS_NAME,
                                         PATCH_TOKENS_NAME, REGISTERS_NAME)
        vit, cfg = self.vit, self.vit.cfg
        grid = (x.shape[-2] // cfg.patch_size, x.shape[-1] // cfg.patch_size)
        tokens, inner, size = vit.forward_tokens(x, self.layers)  # (B, T, D), [(B, T, D)]
        first_register = int(cfg.class_token) + int(cfg.dist_token)
        out = []
        for name in self.names:
            if name == LOGITS_NAME:
                out.append(vit.forward_head(tokens, size=size))  # (B, K)
            elif name == FEATURES_NAME:
                out.append(vit.forward_head(tokens, pre_logits=True, size=size))  # (B, D)
            elif name == PATCH_TOKENS_NAME:
                out.append(vit.patch_grid(tokens, grid))  # (B, D, gh, gw)
            elif name == CLASS_TOKEN_NAME:
                out.append(tokens[:, 0])  # (B, D)
            elif name == REGISTERS_NAME:
                out.append(tokens[:, first_register:first_register + cfg.num_registers])
            else:  # layer_N
                t = inner[self.layers.index(block_of(name))]
                out.append(vit.patch_grid(vit.norm(t) if self.layer_norm else t, grid))
        return tuple(out)


def reference_model(model: ViT, selection: OutputSelection) -> nn.Module:
    """What the ONNX graph computes, in PyTorch: the model, or its outputs wrapper."""
    if selection.default_only:
        return model
    return ViTOutputs(model, selection.names, layer_norm=selection.layer_norm).eval()


def numpy_forward(model: nn.Module):
    """The model as a numpy function for parity checks: (B, C, H, W) float32 -> (B, K), or
    {name: array} for a ViTOutputs wrapper."""
    names = getattr(model, "names", None)

    def forward(x):
        with torch.inference_mode():
            out = model(torch.from_numpy(x))
        if names is None:
            return out.numpy()
        return {name: t.numpy() for name, t in zip(names, out)}
    return forward


def build_model(cfg: ViTConfig, *, seed: int | None = 0) -> ViT:
    """A ViT in eval mode; with random weights drawn from `seed` (reproducible)."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return ViT(cfg).eval()
    return ViT(cfg).eval()
