"""Dense outputs against Hugging Face, at full model size (docs/dense-outputs.md's table).

Builds DINOv2 ViT-S/14 (without and with 4 registers) and ViT-B/16 with transformers
(random weights moved off their init: no download), loads each through our Hugging Face
loader, exports patch_tokens, class_token (register_tokens) and layers 3,6,9,12 to ONNX,
and compares ONNX Runtime (CPU) with transformers at three resolutions, one non-square:
  patch_tokens  vs last_hidden_state[:, prefix:] on the grid
  layer_N       vs Dinov2Backbone.feature_maps (normed)  /  hidden_states[N] (ViT, raw)

    python benchmarks/dense_parity.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import vit_deploy  # noqa: F401  (first: ONNX Runtime's telemetry is off before it loads)
import onnxruntime as ort
import torch
import transformers as T

from vit_deploy.export.checkpoints import load_any
from vit_deploy.export.onnx import OnnxOptions, export_onnx
from vit_deploy.outputs import select_outputs
from vit_deploy.parity import metrics

LAYERS = (3, 6, 9, 12)
S14 = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, patch_size=14,
           image_size=518, mlp_ratio=4, out_indices=list(LAYERS))


def models() -> dict[str, tuple]:
    return {
        "DINOv2 S/14": lambda: _pair(T.Dinov2Model, T.Dinov2Backbone, T.Dinov2Config(**S14)),
        "DINOv2 S/14 + 4 registers": lambda: _pair(
            T.Dinov2WithRegistersModel, T.Dinov2WithRegistersBackbone,
            T.Dinov2WithRegistersConfig(**S14, num_register_tokens=4)),
        "ViT B/16 (ViTModel)": lambda: (T.ViTModel(T.ViTConfig(), add_pooling_layer=False), None),
    }


def _pair(model_cls, backbone_cls, config):
    return model_cls(config), backbone_cls(config)


SIZES = {"DINOv2 S/14": [(224, 224), (518, 518), (280, 420)],
         "DINOv2 S/14 + 4 registers": [(224, 224), (518, 518), (280, 420)],
         "ViT B/16 (ViTModel)": [(224, 224), (384, 384), (256, 448)]}


def run_one(name: str, make, work: Path) -> list[dict]:
    torch.manual_seed(0)
    hf, backbone = make()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    hf.eval()
    if backbone is not None:
        backbone.load_state_dict(hf.state_dict(), strict=False)
        backbone.eval()
    hf.save_pretrained(work / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, _ = load_any(work / "hf")
    dino = backbone is not None
    regs = ours.cfg.num_registers
    names = ["patch_tokens", "class_token"] + (["register_tokens"] if regs else [])
    selection = select_outputs(ours.cfg, names, layers=LAYERS, layer_norm=dino)
    path = export_onnx(ours, work / "dense.onnx", options=OnnxOptions(outputs=selection))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    P, D = ours.cfg.patch_size, ours.cfg.width
    rows = []
    for hw in SIZES[name]:
        x = np.random.default_rng(list(hw)).standard_normal((1, 3, *hw), dtype=np.float32)
        gh, gw = hw[0] // P, hw[1] // P
        with torch.no_grad():
            ref = hf(pixel_values=torch.from_numpy(x), output_hidden_states=True,
                     **({} if dino else {"interpolate_pos_encoding": True}))
            maps = backbone(pixel_values=torch.from_numpy(x)).feature_maps if dino else None
        last = ref.last_hidden_state.numpy()
        grid = lambda t: t.reshape(1, gh, gw, D).transpose(0, 3, 1, 2)  # noqa: E731
        expected = {"patch_tokens": grid(last[:, 1 + regs:]), "class_token": last[:, 0]}
        if regs:
            expected["register_tokens"] = last[:, 1:1 + regs]
        for i, block in enumerate(LAYERS):
            expected[f"layer_{block}"] = (maps[i].numpy() if dino else
                                          grid(ref.hidden_states[block].numpy()[:, 1:]))
        start = time.perf_counter()
        got = dict(zip(selection.names, session.run(None, {"pixel_values": x})))
        ms = (time.perf_counter() - start) * 1e3
        for key, want in expected.items():
            m = metrics(want, got[key])
            rows.append({"model": name, "resolution": f"{hw[0]}x{hw[1]}", "output": key,
                         "shape": list(got[key].shape), "max_abs": m["max_abs"],
                         "max_rel": m["max_rel"], "cosine": m["cosine"], "ort_ms": round(ms, 1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for name, make in models().items():
        with tempfile.TemporaryDirectory() as tmp:
            rows += run_one(name, make, Path(tmp))
        print(f"{name}: done", file=sys.stderr)
    print("| model | resolution | output | shape | max \\|Δ\\| | max rel Δ | cosine |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['resolution']} | {r['output']} | {r['shape']} | "
              f"{r['max_abs']:.1e} | {r['max_rel']:.1e} | {r['cosine']:.7f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    worst = max(r["max_rel"] for r in rows)
    print(f"\nworst max rel Δ {worst:.1e} over {len(rows)} comparisons", file=sys.stderr)
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
