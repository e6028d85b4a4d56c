"""Check token merging against ToMe's own code: the test oracle (tests/export/tome_reference.py),
our PyTorch model and, given a bundle, its ONNX graph.

    python scripts/tome_reference_check.py --tome PATH/TO/ToMe [--bundle DIR --res 448,320x480]

PATH/TO/ToMe is a checkout of github.com/facebookresearch/ToMe; nothing of it is copied here.
Its `tome.patch.timm(model, prop_attn=True)` needs timm's VisionTransformer, Block and
Attention classes, and timm (it imports torchvision) does not install beside our torch:
this script gives it a minimal stand-in module with those three classes and timm's
attribute names (qkv, proj, num_heads, scale, norm1/2, mlp, drop_path1/2, blocks,
cls_token). The patch replaces Block.forward and Attention.forward by its own, so what
runs in every block is the reference's code; the stand-in only embeds (our model's
`embed`) and applies the final norm. Compared: the tokens after the final norm and their
sizes, and the logits (the head applied to the reference's tokens).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


def load_reference(tome: Path):
    """tome.merge, tome.utils and tome.patch.timm from a checkout, over a timm stand-in
    (tome/__init__.py is not run: it imports the visualiser and the other patches)."""
    vt = types.ModuleType("timm.models.vision_transformer")

    class Attention(nn.Module):
        pass

    class Block(nn.Module):
        pass

    class VisionTransformer(nn.Module):
        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.norm(x)

    vt.Attention, vt.Block, vt.VisionTransformer = Attention, Block, VisionTransformer
    for name in ("timm", "timm.models"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["timm.models.vision_transformer"] = vt
    for name, path in (("tome", tome / "tome"), ("tome.patch", tome / "tome" / "patch")):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(path)]
        sys.modules[name] = pkg
    return importlib.import_module("tome.patch.timm"), vt


def timm_like(vit, vt) -> nn.Module:
    """A timm-shaped VisionTransformer sharing `vit`'s modules (our ViT, vit_deploy)."""
    model = vt.VisionTransformer()
    model.embed, model.norm = vit.embed, vit.norm
    model.cls_token = vit.cls_token
    if vit.dist_token is not None:
        model.dist_token = vit.dist_token
    model.blocks = nn.Sequential()
    for ours in vit.blocks:
        attn = vt.Attention()
        attn.qkv, attn.proj = ours.attn.qkv, ours.attn.proj
        attn.num_heads, attn.scale = ours.attn.heads, ours.attn.head_dim ** -0.5
        attn.attn_drop, attn.proj_drop = nn.Identity(), nn.Identity()
        block = vt.Block()
        block.norm1, block.attn, block.norm2, block.mlp = ours.norm1, attn, ours.norm2, ours.mlp
        block.drop_path1, block.drop_path2 = nn.Identity(), nn.Identity()
        model.blocks.append(block)
    return model.eval()


def relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tome", required=True, type=Path, help="a ToMe checkout")
    p.add_argument("--bundle", type=Path, help="a merged bundle: also its fp32 ONNX graph")
    p.add_argument("--res", default="448,320x480", help="bundle sizes, HxW or N")
    p.add_argument("--batches", default="1,2")
    p.add_argument("--oracle-on-bundle", action="store_true",
                   help="also run the (slow, per-token) oracle on the bundle's model")
    args = p.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "export")]
    from tome_reference import reference_forward

    from vit_deploy.export.model import build_model
    from vit_deploy.runtime.config import variant

    patch, vt = load_reference(args.tome)
    rng = np.random.default_rng(0)

    def compare(label, vit, merge, sizes, batches, *, onnx=None, oracle=True):
        ref_model = timm_like(vit, vt)
        patch.apply_patch(ref_model, prop_attn=True)
        ref_model.r = list(merge)
        for hw in sizes:
            for b in batches:
                x = torch.from_numpy(rng.standard_normal((b, 3, *hw), dtype=np.float32))
                with torch.no_grad():
                    tokens = ref_model(x)
                    size = ref_model._tome_info["size"]
                    logits = vit.forward_head(tokens, size=size)
                    ours = vit.forward_tokens(x)
                    ours_logits = vit.forward_head(ours.normed, size=ours.size)
                line = (f"{label:34s} {hw[0]:>4}x{hw[1]:<4} b{b}  tokens {tokens.shape[1]:>4}  "
                        f"ours: tokens {relative(ours.normed, tokens):.1e} "
                        f"logits {relative(ours_logits, logits):.1e}")
                if oracle:
                    o = reference_forward(vit, x, merge)
                    line += f"  oracle: logits {relative(o, logits):.1e}"
                if onnx is not None:
                    got = onnx.run(None, {"pixel_values": x.numpy()})[0]
                    line += f"  onnx: logits {relative(got, logits):.1e}"
                print(line, flush=True)

    tiny = dict(width=48, heads=3, img_size=(32, 32), num_classes=5)
    cases = [
        ("cls, merge 4,3,4", variant("S/8", depth=3, **tiny), (4, 3, 4)),
        ("cls+dist (DeiT), merge 3,3,3", variant("S/8", depth=3, dist_token=True, **tiny),
         (3, 3, 3)),
        ("no prefix, mean pool, merge 4,4,2",
         variant("S/8", depth=3, class_token=False, pool="mean", **tiny), (4, 4, 2)),
    ]
    for label, cfg, merge in cases:
        vit = build_model(cfg.replace(merge=merge), seed=1)
        with torch.no_grad():
            for q in vit.parameters():
                q.add_(torch.randn_like(q) * 0.05)
        compare(label, vit, merge, [(32, 32), (48, 64), (16, 24), (8, 8), (24, 16)], (1, 3))

    if args.bundle:
        import onnxruntime as ort

        from vit_deploy.export.checkpoints import load_model

        vit = load_model(args.bundle / "weights.safetensors").eval()
        session = ort.InferenceSession(str(args.bundle / "model.onnx"),
                                       providers=["CPUExecutionProvider"])
        sizes = [tuple(int(v) for v in (s.split("x") * 2)[:2]) for s in args.res.split(",")]
        compare(f"{vit.cfg.name} merge {list(vit.cfg.merge)[:1]}", vit, vit.cfg.merge, sizes,
                [int(b) for b in args.batches.split(",")], onnx=session,
                oracle=args.oracle_on_bundle)


if __name__ == "__main__":
    main()
