"""The SigLIP and SigLIP 2 image towers (SiglipVisionModel, Siglip2VisionModel): no class
token, every token through post_layernorm, the attention-pooling head. SigLIP 2: its linear
patch embedding (patches flattened row, column, channel) becomes the convolution; the table
resized bilinear with antialias."""

from __future__ import annotations

from typing import Any

from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.checkpoints.family import Family
from vit_deploy.export.checkpoints.tower import Tower, TowerKeys, learned_table, load_tower


def tokens(t: Tower) -> None:
    """The position table (a square grid, no class row), the last norm."""
    learned_table(t, class_rows=0)
    post = t.prefix + "post_layernorm"
    t.spec += [("norm.weight", (post + ".weight",)), ("norm.bias", (post + ".bias",))]


def tokens2(t: Tower) -> None:
    """SigLIP's, the patch embedding a Linear, the table's size said by num_patches."""
    patch = t.patch
    # Linear over patches flattened (row, column, channel) -> a convolution
    t.convert["patch_embed.proj.weight"] = lambda t: t.reshape(
        t.shape[0], patch, patch, -1).permute(0, 3, 1, 2) if t.dim() == 2 else t
    tokens(t)
    expected, rows = t.get.int("num_patches", None), t.grid[0] * t.grid[1]
    if expected is not None and expected != rows:
        raise CheckpointError(f"{t.where}: config.json says num_patches {expected}, its "
                              f"position table holds {rows} rows")


def config(t: Tower) -> dict[str, Any]:
    return dict(pool="map" if t.use_head else "mean")


def config2(t: Tower) -> dict[str, Any]:
    return dict(config(t), pos_interp="bilinear", pos_antialias=True)


_BLOCKS = dict(layers=("encoder.layers.",), attention="self_attn.", out="out_proj",
               mlp=("mlp.fc1", "mlp.fc2"), norms=("layer_norm1", "layer_norm2"),
               patch="patch_embedding", map_head=True)
_HALF = ((0.5,) * 3, (0.5,) * 3)
FAMILY = Family("siglip", ("siglip_vision_model",), load_tower,
                TowerKeys(tokens=tokens, **_BLOCKS), config, normalisation=_HALF)
FAMILY2 = Family("siglip2", ("siglip2_vision_model",), load_tower,
                 TowerKeys(tokens=tokens2, **_BLOCKS), config2, normalisation=_HALF)
