"""The DINOv3 ViT (DINOv3ViTModel): rotary positions, registers, layer scale, the MLP plain
or gated (use_gated_mlp: SwiGLU with hidden_act silu, the H+ / 7B models; gate_proj ->
mlp.gate, up_proj -> mlp.fc1, down_proj -> mlp.fc2); the absent q/k/v, output and MLP biases
are zeros (tower.load_tower)."""

from __future__ import annotations

from typing import Any

from vit_deploy.export.checkpoints.family import Family
from vit_deploy.export.checkpoints.tower import Tower, TowerKeys, load_tower


def tokens(t: Tower) -> None:
    """The class token, the registers (none: an empty tensor, dropped), the last norm; the
    grid of config.json's image_size (no position table: rotary positions)."""
    E, prefix = t.E, t.prefix
    reg = t.state.get(E + "register_tokens")
    t.regs = reg.shape[1] if reg is not None and reg.dim() == 3 else 0
    t.spec.append(("cls_token", (E + "cls_token",)))
    if t.regs:
        t.spec.append(("reg_token", (E + "register_tokens",)))
    elif reg is not None and reg.numel() == 0:  # num_register_tokens 0: an empty tensor
        t.given.pop(E + "register_tokens")
    t.spec += [("norm.weight", (prefix + "norm.weight",)), ("norm.bias", (prefix + "norm.bias",))]
    size = t.get.pair("image_size", (224, 224))
    t.grid = (size[0] // t.patch, size[1] // t.patch)


def config(t: Tower) -> dict[str, Any]:
    return dict(class_token=True, pool="cls", pos_embed="rope")


KEYS = TowerKeys(layers=("layer.", "model.layer."), attention="attention.", out="o_proj",
                 mlp=("mlp.up_proj", "mlp.down_proj"), gate="mlp.gate_proj",
                 norms=("norm1", "norm2"),
                 patch="patch_embeddings", tokens=tokens,
                 layer_scale=(("ls1.gamma", "layer_scale1.lambda1"),
                              ("ls2.gamma", "layer_scale2.lambda1")))
FAMILY = Family("dinov3", ("dinov3_vit",), load_tower, KEYS, config)
