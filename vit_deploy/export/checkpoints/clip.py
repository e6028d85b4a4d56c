"""The CLIP image tower (CLIPVisionModel, CLIPVisionModelWithProjection): LayerNorm before
the blocks, quick_gelu, post_layernorm on the pooled class token (our fc_norm; the patch
tokens stay un-normed, as transformers' last_hidden_state), the bias-free visual projection
when present."""

from __future__ import annotations

from typing import Any

from vit_deploy.export.checkpoints.family import Family
from vit_deploy.export.checkpoints.tower import Tower, TowerKeys, learned_table, load_tower

OPENAI_CLIP_MEAN, OPENAI_CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954,
                                                                           0.26130258, 0.27577711)


def tokens(t: Tower) -> None:
    """The class embedding (a row of its own before the position table's grid), the norms
    before the blocks and on the pooled token, the projection."""
    E, prefix = t.E, t.prefix
    learned_table(t, class_rows=1)
    post = prefix + "post_layernorm"
    t.spec += [("cls_token", (E + "class_embedding",)),
               ("pre_norm.weight", (prefix + "pre_layrnorm.weight",)),
               ("pre_norm.bias", (prefix + "pre_layrnorm.bias",)),
               ("fc_norm.weight", (post + ".weight",)), ("fc_norm.bias", (post + ".bias",))]
    t.convert["cls_token"] = lambda t: t.reshape(1, 1, -1)
    if "visual_projection.weight" in t.state:
        t.spec.append(("proj.weight", ("visual_projection.weight",)))


def config(t: Tower) -> dict[str, Any]:
    proj = t.state.get("visual_projection.weight")
    return dict(class_token=True, pos_prefix_tokens=1, fc_norm=True, pool="cls", pre_norm=True,
                proj_dim=proj.shape[0] if proj is not None and proj.dim() == 2 else 0)


KEYS = TowerKeys(layers=("encoder.layers.",), attention="self_attn.", out="out_proj",
                 mlp=("mlp.fc1", "mlp.fc2"), norms=("layer_norm1", "layer_norm2"),
                 patch="patch_embedding", tokens=tokens, patch_bias=False)
FAMILY = Family("clip", ("clip_vision_model",), load_tower, KEYS, config,
                normalisation=(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD))
