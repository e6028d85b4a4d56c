"""timm and Hugging Face checkpoints reproduce their framework's outputs at any size."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from vit_deploy.export.checkpoints import CheckpointError
from vit_deploy.cli import main
from vit_deploy.config import variant
from vit_deploy.export.onnx import export_onnx
from vit_deploy.export.checkpoints import load_any
from vit_deploy.export.model import build_model

import transformers  # noqa: E402  (the test extra installs it)

SIZES = [(32, 32), (48, 64), (40, 40), (24, 16)]  # native, non-square larger, square, smaller
SMALL = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, image_size=32,
             patch_size=8)


def _hf_models():
    T = transformers
    return {
        "ViTForImageClassification": lambda: T.ViTForImageClassification(
            T.ViTConfig(**SMALL, intermediate_size=192, num_labels=5)),
        "ViTModel": lambda: T.ViTModel(T.ViTConfig(**SMALL, intermediate_size=192),
                                       add_pooling_layer=False),
        "DeiTForImageClassificationWithTeacher": lambda: T.DeiTForImageClassificationWithTeacher(
            T.DeiTConfig(**SMALL, intermediate_size=192, num_labels=5)),
        "DeiTForImageClassification": lambda: T.DeiTForImageClassification(
            T.DeiTConfig(**SMALL, intermediate_size=192, num_labels=4)),
        "Dinov2Model": lambda: T.Dinov2Model(T.Dinov2Config(**SMALL, mlp_ratio=4)),
        "Dinov2WithRegistersModel": lambda: T.Dinov2WithRegistersModel(
            T.Dinov2WithRegistersConfig(**SMALL, mlp_ratio=4, num_register_tokens=2)),
    }


def _reference(model, x):
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x), interpolate_pos_encoding=True)
    if getattr(out, "logits", None) is not None:
        return out.logits.numpy()
    if getattr(out, "pooler_output", None) is not None:
        return out.pooler_output.numpy()
    return out.last_hidden_state[:, 0].numpy()


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """Every supported architecture, random weights, saved with save_pretrained."""
    out = {}
    for name, make in _hf_models().items():
        torch.manual_seed(0)
        model = make().eval()
        with torch.no_grad():  # move every weight off its init so nothing matches by accident
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        directory = tmp_path_factory.mktemp("hf") / name
        model.save_pretrained(directory)
        out[name] = (model, directory)
    return out


@pytest.mark.parametrize("name", list(_hf_models()))
def test_hf_checkpoint_matches_transformers_in_torch_and_onnx(hf_checkpoints, name, tmp_path):
    hf, directory = hf_checkpoints[name]
    ours, fmt = load_any(directory)
    assert fmt == "hf"
    assert ours.cfg.pos_antialias == (name == "Dinov2WithRegistersModel")
    assert ours.cfg.norm_eps == (1e-6 if name.startswith("Dinov2") else 1e-12)
    path = export_onnx(ours, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for hw in SIZES:
        x = rng.standard_normal((2, 3, *hw), dtype=np.float32)
        ref = _reference(hf, x)
        with torch.no_grad():
            mine = ours(torch.from_numpy(x)).numpy()
        onnx_out = session.run(None, {"pixel_values": x})[0]
        assert np.abs(mine - ref).max() <= 1e-4, (name, hw)
        assert np.abs(onnx_out - ref).max() <= 1e-4, (name, hw)


def test_the_interpolation_mode_matters(hf_checkpoints):
    hf, directory = hf_checkpoints["Dinov2WithRegistersModel"]
    ours, _ = load_any(directory)
    wrong = build_model(ours.cfg.replace(pos_antialias=False), seed=None)
    wrong.load_state_dict(ours.state_dict())
    x = np.random.default_rng(1).standard_normal((1, 3, 48, 64), dtype=np.float32)
    with torch.no_grad():
        gap = np.abs(wrong(torch.from_numpy(x)).numpy() - _reference(hf, x)).max()
    assert gap > 1e-3  # without antialias the outputs drift from transformers'


def _as_timm(model) -> dict:
    return {("pos_embed" if k == "pos.pos_embed" else k): v.clone()
            for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind,overrides", [
    ("vit", dict()),
    ("deit-distilled", dict(dist_token=True, pos_prefix_tokens=2)),
    ("deit3-no-embed-class", dict(layer_scale=True, pos_prefix_tokens=0)),
    ("avg-fc-norm", dict(pool="mean", fc_norm=True)),
    ("registers", dict(num_registers=4, pos_prefix_tokens=0, layer_scale=True)),
])
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_timm_layouts(tmp_path, kind, overrides, suffix):
    cfg = variant("S/16", depth=2, img_size=(64, 64), num_classes=7, pos_antialias=True,
                  **overrides)
    source = build_model(cfg, seed=3)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    path = tmp_path / f"timm{suffix}"
    state = _as_timm(source)
    if suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save({"model": state}, path)
    loaded, fmt = load_any(path)
    assert fmt == "timm"
    c = loaded.cfg
    assert (c.width, c.depth, c.heads, c.patch_size, c.img_size) == (384, 2, 6, 16, (64, 64))
    assert (c.dist_token, c.num_registers, c.layer_scale, c.fc_norm, c.num_pos_prefix) == (
        cfg.dist_token, cfg.num_registers, cfg.layer_scale, cfg.fc_norm, cfg.num_pos_prefix)
    assert c.pos_antialias  # timm resamples bicubic with antialias
    for hw in [(64, 64), (96, 48)]:
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), source(x), rtol=0, atol=0)


def test_unknown_layouts_and_types_are_explained(tmp_path):
    save_file({"encoder.weird": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="no known layout"):
        load_any(tmp_path / "w.safetensors")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "swin"}))
    with pytest.raises(CheckpointError, match="model_type 'swin' is not supported"):
        load_any(tmp_path / "hf")


def test_export_cli_takes_a_hf_directory(hf_checkpoints, tmp_path):
    _, directory = hf_checkpoints["DeiTForImageClassificationWithTeacher"]
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(directory), "--res", "48x64",
                                  "--out", str(out), "--no-simplify"])
    assert r.exit_code == 0, r.output
    assert "hf format" in r.output and "parity: PASS" in r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["dist_token"] and manifest["config"]["name"] == "hf-deit"
