"""timm and Hugging Face checkpoints reproduce their framework's outputs at any size."""

import json
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save, save_file

from vit_deploy.cli import main
from vit_deploy.runtime.config import ViTConfig, variant
from vit_deploy.export.checkpoints import (CONFIG_KEY, CheckpointError, CheckpointWarning,
                                           load_any, load_timm, model_from_state,
                                           read_state_dict)
from vit_deploy.export.model import build_model
from vit_deploy.export.onnx import export_onnx

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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours, fmt = load_any(directory)
    assert fmt == "hf"
    reported = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    # DINOv2 checkpoints carry a mask token the forward pass never uses: reported, not dropped
    expected = (f"{directory}: not used, these tensors do not change the exported outputs: "
                "['embeddings.mask_token']")
    assert reported == ([expected] if name.startswith("Dinov2") else [])
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
    with pytest.warns(CheckpointWarning, match="mask_token"):
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


# -- Lying checkpoints: a config that disagrees with its weights, tensors that disagree with
# each other. Each is refused with a CheckpointError that names both sides, never a
# KeyError / IndexError / RuntimeError from deep inside the loader.

TINY = variant("tiny")  # width 48, depth 2, heads 3, patch 8, 32x32 (a 4x4 grid), 10 classes


@pytest.fixture(scope="module")
def tiny_state():
    model = build_model(TINY, seed=0)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def _write_ours(path, state, config) -> Path:
    """Our safetensors with `config` (a dict, or raw text) as its metadata."""
    text = config if isinstance(config, str) else json.dumps(config)
    path.write_bytes(save({k: v.contiguous() for k, v in state.items()},
                          metadata={CONFIG_KEY: text}))
    return path


def _cfg(**changes):
    return {**TINY.to_dict(), **changes}


def _without(state, pattern):
    return {k: v for k, v in state.items() if not k.startswith(pattern)}


def _renamed(state, old, new):
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in state.items()}


# (id, config changes or raw text, state edit, what the message must name)
OURS_LIES = [
    ("more-layers", {"depth": 3}, None, ["depth 3", "2 blocks", "blocks.0-1"]),
    ("fewer-layers", {"depth": 1}, None, ["depth 1", "2 blocks", "blocks.0-1"]),
    ("weights-lack-a-block", {}, lambda s: _without(s, "blocks.1."),
     ["depth 2", "1 block ", "blocks.0"]),
    ("blocks-with-a-gap", {}, lambda s: _renamed(s, "blocks.1.", "blocks.2."),
     ["depth 2", "blocks.0, 2", "blocks.1 missing"]),
    ("width", {"width": 96}, None, ["width 96", "48 wide"]),
    ("heads-not-dividing", {"heads": 5}, None, ["heads 5", "width 48"]),
    ("patch", {"patch_size": 16}, None, ["patch_size 16", "8x8"]),
    ("patch-string", {"patch_size": "8"}, None, ["patch_size", "'8'"]),
    ("patch-float", {"patch_size": 8.0}, None, ["patch_size", "8.0"]),
    ("patch-bool", {"patch_size": True}, None, ["patch_size", "True"]),
    ("in-chans", {"in_chans": 1, "mean": [0.5], "std": [0.5]}, None, ["in_chans 1", "3 channels"]),
    ("mlp-ratio", {"mlp_ratio": 2.0}, None, ["mlp_ratio 2.0", "96 wide", "192 wide"]),
    ("num-classes", {"num_classes": 5}, None, ["num_classes 5", "10 classes"]),
    ("no-head", {"num_classes": 0}, None, ["num_classes 0", "(10, 48)"]),
    ("img-size", {"img_size": [64, 64]}, None, ["64x64", "65 position rows", "(1, 17, 48)"]),
    ("qkv-bias", {"qkv_bias": False}, None, ["qkv_bias False", "blocks.0.attn.qkv.bias"]),
    ("registers", {"num_registers": 2}, None, ["num_registers 2", "no reg_token"]),
    ("qkv-shape", {}, lambda s: {**s, "blocks.1.attn.qkv.weight": torch.zeros(100, 48)},
     ["width 48", "(144, 48)", "(100, 48)"]),
    ("not-json", "{depth: 2", None, ["not JSON", CONFIG_KEY]),
    ("not-an-object", "[1, 2]", None, ["JSON list, not an object"]),
    ("unknown-key", {"depth": 2, "layers": 2}, None, ["unknown ViTConfig keys", "layers"]),
]


@pytest.mark.parametrize("changes,edit,names", [c[1:] for c in OURS_LIES],
                         ids=[c[0] for c in OURS_LIES])
def test_our_lying_checkpoints_are_refused_naming_both_sides(tmp_path, tiny_state, changes,
                                                             edit, names):
    state = edit(tiny_state) if edit else tiny_state
    path = _write_ours(tmp_path / "lie.safetensors", state,
                       changes if isinstance(changes, str) else _cfg(**changes))
    with pytest.raises(CheckpointError) as info:
        load_any(path)
    message = str(info.value)
    assert str(path) in message
    for name in names:
        assert name in message, (name, message)


def test_the_explanation_comes_before_the_key_lists(tmp_path, tiny_state):
    path = _write_ours(tmp_path / "deep.safetensors", tiny_state, _cfg(depth=3))
    with pytest.raises(CheckpointError) as info:
        load_any(path)
    message = str(info.value)
    assert message.index("the checkpoint's config says depth 3, its weights hold 2 blocks "
                         "(blocks.0-1)") < message.index("missing keys: ['blocks.2.")


def _timm_state(tiny_state):
    return {("pos_embed" if k == "pos.pos_embed" else k): v for k, v in tiny_state.items()}


TIMM_LIES = [
    ("blocks-with-a-gap", lambda s: _renamed(s, "blocks.1.", "blocks.2."), 3,
     ["depth 3", "2 blocks", "blocks.0, 2", "blocks.1 missing"]),
    ("blocks-not-from-0", lambda s: _renamed(_renamed(s, "blocks.1.", "blocks.2."),
                                             "blocks.0.", "blocks.1."), 3,
     ["depth 3", "2 blocks", "blocks.0 missing"]),
    ("qkv-not-3x-width", lambda s: {**s, "blocks.0.attn.qkv.weight": torch.zeros(100, 48),
                                    "blocks.0.attn.qkv.bias": torch.zeros(100)}, 3,
     ["width 48", "(144, 48)", "(100, 48)"]),
    ("pos-rows-not-a-grid", lambda s: {**s, "pos_embed": torch.zeros(1, 20, 48)}, 3,
     ["20 rows", "19 rows", "square"]),
    ("mlp-widths-differ", lambda s: {**s, "blocks.1.mlp.fc1.weight": torch.zeros(96, 48),
                                     "blocks.1.mlp.fc1.bias": torch.zeros(96),
                                     "blocks.1.mlp.fc2.weight": torch.zeros(48, 96)}, 3,
     ["192 wide", "96 wide", "blocks.1.mlp.fc1.weight"]),
    ("patch-embed-3d", lambda s: {**s, "patch_embed.proj.weight": torch.zeros(48, 3, 8)}, 3,
     ["patch_embed.proj.weight", "(48, 3, 8)", "4-D"]),
    ("patch-not-square", lambda s: {**s, "patch_embed.proj.weight": torch.zeros(48, 3, 8, 4)},
     3, ["8x4"]),
    ("no-fc1", lambda s: _without(s, "blocks.0.mlp.fc1.weight"), 3,
     ["blocks.0.mlp.fc1.weight is missing"]),
    ("reg-token-1d", lambda s: {**s, "reg_token": torch.zeros(48)}, 3, ["reg_token", "(48,)"]),
    ("heads-not-dividing", lambda s: s, 5, ["5 heads", "width 48"]),
    ("head-bias-disagrees", lambda s: {**s, "head.bias": torch.zeros(7)}, 3,
     ["head.bias: checkpoint (7,) vs model (10,)"]),
    ("extra-tensor", lambda s: {**s, "blocks.0.attn.extra": torch.zeros(3)}, 3,
     ["unexpected keys", "blocks.0.attn.extra"]),
]


@pytest.mark.parametrize("edit,heads,names", [c[1:] for c in TIMM_LIES],
                         ids=[c[0] for c in TIMM_LIES])
def test_timm_lying_checkpoints_are_refused_naming_both_sides(tmp_path, tiny_state, edit,
                                                              heads, names):
    path = tmp_path / "timm.safetensors"
    save_file({k: v.contiguous() for k, v in edit(_timm_state(tiny_state)).items()}, str(path))
    with pytest.raises(CheckpointError) as info:
        load_any(path, heads=heads)
    message = str(info.value)
    for name in names:
        assert name in message, (name, message)


@pytest.fixture(scope="module")
def hf_vit(tmp_path_factory):
    """The tiny ViTForImageClassification (48 wide, 2 layers, 3 heads, patch 8, 32x32, 5
    labels), saved once; each lie edits a copy."""
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(
        transformers.ViTConfig(**SMALL, intermediate_size=192, num_labels=5)).eval()
    directory = tmp_path_factory.mktemp("hf-vit") / "vit"
    model.save_pretrained(directory)
    return directory


def _hf_copy(source, target, config=None, edit=None) -> Path:
    shutil.copytree(source, target)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(
            {**json.loads((source / "config.json").read_text()), **config})
        (target / "config.json").write_text(text)
    if edit is not None:
        state = edit(load_file(str(source / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in state.items()},
                  str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


L0 = "vit.encoder.layer.0."
HF_LIES = [
    ("not-json", "{hidden_size: 48", None, ["config.json", "not JSON"]),
    ("not-an-object", "[48]", None, ["config.json", "JSON list, not an object"]),
    ("hidden-size-string", {"hidden_size": "48"}, None, ["hidden_size", "'48'"]),
    ("hidden-size-bool", {"hidden_size": True}, None, ["hidden_size", "True"]),
    ("no-layers", {"num_hidden_layers": 0}, None, ["num_hidden_layers", "got 0"]),
    ("patch-float", {"patch_size": 16.5}, None, ["patch_size", "16.5"]),
    ("model-type-list", {"model_type": ["vit"]}, None, ["model_type ['vit']"]),
    ("more-layers", {"num_hidden_layers": 3}, None,
     ["num_hidden_layers 3", "2 layers", "vit.encoder.layer.0-1"]),
    ("fewer-layers", {"num_hidden_layers": 1}, None, ["num_hidden_layers 1", "2 layers"]),
    ("hidden-size", {"hidden_size": 96}, None, ["hidden_size 96", "48 wide"]),
    ("heads-not-dividing", {"num_attention_heads": 5}, None,
     ["num_attention_heads 5", "hidden_size 48"]),
    ("patch", {"patch_size": 16}, None, ["patch_size 16", "8x8"]),
    ("channels", {"num_channels": 1}, None, ["num_channels 1", "3 channels"]),
    ("intermediate", {"intermediate_size": 96}, None, ["intermediate_size 96", "192 wide"]),
    ("image-size", {"image_size": 64}, None, ["image_size [64, 64]", "65 position rows",
                                               "17 rows"]),
    ("layers-with-a-gap", None, lambda s: _renamed(s, "vit.encoder.layer.1.",
                                                   "vit.encoder.layer.2."),
     ["num_hidden_layers 2", "vit.encoder.layer.0, 2", "vit.encoder.layer.1 missing"]),
    ("missing-tensor", None, lambda s: _without(s, "vit.encoder.layer.1.output.dense.bias"),
     ["needs tensors its weights lack", "vit.encoder.layer.1.output.dense.bias"]),
    ("unused-tensor", None, lambda s: {**s, L0 + "extra.weight": torch.zeros(3)},
     ["does not use", L0 + "extra.weight"]),
    ("many-unused", None, lambda s: {**s, **{f"extra.{i}": torch.zeros(1) for i in range(7)}},
     ["does not use", "extra.0", "(+2 more)"]),
    ("key-shape", None, lambda s: {**s, L0 + "attention.attention.key.weight":
                                   torch.zeros(40, 48)},
     [L0 + "attention.attention.key.weight: checkpoint (40, 48) vs expected (48, 48)"]),
    ("pos-rows", None,
     lambda s: {**s, "vit.embeddings.position_embeddings": torch.zeros(1, 20, 48)},
     ["position_embeddings has shape (1, 20, 48)", "20 rows less 1 prefix row"]),
    ("classifier-1d", None, lambda s: {**s, "classifier.weight": torch.zeros(5)},
     ["classifier.weight has shape (5,)"]),
    ("int-weights", None, lambda s: {**s, "classifier.bias": torch.zeros(5, dtype=torch.int64)},
     ["not floating point", "classifier.bias (int64)"]),
]


@pytest.mark.parametrize("config,edit,names", [c[1:] for c in HF_LIES],
                         ids=[c[0] for c in HF_LIES])
def test_hf_lying_checkpoints_are_refused_naming_both_sides(tmp_path, hf_vit, config, edit,
                                                            names):
    directory = _hf_copy(hf_vit, tmp_path / "hf", config, edit)
    with pytest.raises(CheckpointError) as info:
        load_any(directory)
    message = str(info.value)
    for name in names:
        assert name in message, (name, message)


OTHER_HF_LIES = [
    ("Dinov2WithRegistersModel", {"num_register_tokens": 3}, None,
     ["num_register_tokens 3", "2 register tokens", "(1, 2, 48)"]),
    ("Dinov2Model", {"mlp_ratio": 2}, None, ["mlp_ratio 2.0 (an MLP 96 wide)", "192 wide"]),
    ("Dinov2Model", None, lambda s: _without(s, "encoder.layer.1.layer_scale2.lambda1"),
     ["needs tensors its weights lack", "encoder.layer.1.layer_scale2.lambda1"]),
    ("DeiTForImageClassificationWithTeacher", None,
     lambda s: _without(s, "distillation_classifier.weight"),
     ["does not use", "distillation_classifier.bias"]),
    ("DeiTForImageClassificationWithTeacher", {"image_size": 48}, None,
     ["image_size [48, 48]", "38 position rows", "18 rows"]),
]


@pytest.mark.parametrize("name,config,edit,names", OTHER_HF_LIES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(OTHER_HF_LIES)])
def test_other_hf_architectures_lying(tmp_path, hf_checkpoints, name, config, edit, names):
    directory = _hf_copy(hf_checkpoints[name][1], tmp_path / "hf", config, edit)
    with pytest.raises(CheckpointError) as info:
        load_any(directory)
    for part in names:
        assert part in str(info.value), (part, str(info.value))


def test_flags_that_disagree_with_a_bare_state_dict_are_named(tmp_path, tiny_state):
    save_file(tiny_state, str(tmp_path / "bare.safetensors"))
    with pytest.raises(CheckpointError) as info:
        load_any(tmp_path / "bare.safetensors", fallback_cfg=variant("tiny", depth=4))
    assert ("the given config says depth 4, its weights hold 2 blocks (blocks.0-1)"
            in str(info.value))
    model, fmt = load_any(tmp_path / "bare.safetensors", fallback_cfg=TINY)
    assert fmt == "vit-deploy" and model.cfg == TINY


def test_hf_tensors_irrelevant_to_the_outputs_are_reported_not_dropped(tmp_path, hf_vit):
    torch.manual_seed(0)
    hf = transformers.ViTModel(transformers.ViTConfig(**SMALL, intermediate_size=192),
                               add_pooling_layer=True, use_mask_token=True).eval()
    hf.save_pretrained(tmp_path / "pooled")
    with pytest.warns(CheckpointWarning) as record:
        ours, _ = load_any(tmp_path / "pooled")
    message = str(record[0].message)
    for name in ("pooler.dense.weight", "pooler.dense.bias", "embeddings.mask_token"):
        assert name in message
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(pixel_values=x).last_hidden_state[:, 0]
        torch.testing.assert_close(ours(x), ref, rtol=0, atol=1e-5)
    with warnings.catch_warnings():  # a file with nothing to report says nothing
        warnings.simplefilter("error")
        load_any(hf_vit)


def test_read_state_dict_refuses_what_are_not_weights(tmp_path, tiny_state):
    torch.save({"model": {**tiny_state, "steps": torch.tensor([3])}}, tmp_path / "int.pth")
    with pytest.raises(CheckpointError, match=r"not floating point.*steps \(int64\)"):
        read_state_dict(tmp_path / "int.pth")
    torch.save({0: torch.zeros(2), "a": torch.zeros(2)}, tmp_path / "keys.pth")
    with pytest.raises(CheckpointError, match="keys must be strings"):
        read_state_dict(tmp_path / "keys.pth")
    save_file({"w": torch.zeros(2, dtype=torch.int32)}, str(tmp_path / "int.safetensors"))
    with pytest.raises(CheckpointError, match=r"w \(int32\)"):
        read_state_dict(tmp_path / "int.safetensors")


# -- Fuzz: whatever a field or a tensor says, the loader loads a consistent model or raises
# CheckpointError, nothing else.
JSON_SCALARS = (st.none() | st.booleans() | st.integers(-3, 200)
                | st.integers(-2**63, 2**63) | st.floats(allow_nan=True, allow_infinity=True)
                | st.sampled_from([0.0, 1.0, 2.0, 4.0, 4.0000001, 1e-6, 1e300])
                | st.text(max_size=8) | st.sampled_from(["8", "learned", "mean", "bicubic"]))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4), max_leaves=8)
FUZZ = settings(derandomize=True, deadline=None, max_examples=100,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def _assert_consistent(model, state, cfg=None):
    if cfg is not None:
        assert model.cfg == cfg
    own = model.state_dict()
    assert set(own) == set(state)
    for k, v in state.items():
        assert torch.equal(own[k], v.to(own[k].dtype)), k


def _near(value):
    """Values of the field's own type near its current one (most of them load or are
    refused for what they say, not for their type)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-1, 2 * value + 2) | st.sampled_from([0, 1, value, 2**31 - 1])
    if isinstance(value, float):
        return st.floats(0, 2 * value + 1) | st.sampled_from([value, -value])
    if isinstance(value, str):
        return st.sampled_from(["learned", "factorized", "cls", "mean", "bicubic", "bilinear",
                                "x", ""])
    if isinstance(value, list):
        return st.lists(st.sampled_from([0, 1, 8, 16, 32, 40, 0.5, 0.25]), max_size=4) \
            | st.just(value)
    return st.none()


def _loaded_or_refused(load, *args, **kwargs):
    """What the loader returns, or None when it refuses with a CheckpointError (the only
    failure allowed); either outcome is a hypothesis event, so the mix is visible."""
    try:
        result = load(*args, **kwargs)
    except CheckpointError:
        event("refused")
        return None
    event("loaded")
    return result


@FUZZ
@given(field_value=st.sampled_from(sorted(TINY.to_dict()) + ["unknown_field"]).flatmap(
    lambda f: st.tuples(st.just(f), _near(TINY.to_dict().get(f)) | JSON_VALUES)))
def test_fuzz_our_config_field(tiny_state, field_value):
    field, value = field_value
    config = _cfg(**{field: value})
    with tempfile.TemporaryDirectory() as d:
        loaded = _loaded_or_refused(load_any, _write_ours(Path(d) / "m.safetensors",
                                                          tiny_state, config))
    if loaded is None:
        return
    model, fmt = loaded
    assert fmt == "vit-deploy"
    _assert_consistent(model, tiny_state, ViTConfig.from_dict(config))
    with torch.no_grad():
        assert model(torch.zeros(1, model.cfg.in_chans, *model.cfg.img_size)).shape == (1, 10)


SHAPE_SIZES = st.sampled_from([0, 1, 2, 3, 4, 8, 10, 16, 17, 20, 48, 96, 144, 192])
SHAPES = st.lists(SHAPE_SIZES, max_size=4).filter(lambda s: math.prod(s) <= 200_000)


@st.composite
def state_edits(draw, keys):
    """Delete a tensor, reshape one, add one, or move a block to another index."""
    kind = draw(st.sampled_from(["delete", "reshape", "add", "move"]))
    if kind == "move":
        return kind, draw(st.integers(0, 1)), draw(st.integers(0, 4)), None
    key = draw(st.sampled_from(keys) if kind != "add" else
               st.sampled_from(["blocks.2.norm1.weight", "reg_token", "dist_token", "extra",
                                "fc_norm.weight", "blocks.0.ls1.gamma", "head_dist.weight"]))
    return kind, key, None, draw(SHAPES)


def _edited(state, edit):
    kind, key, to, shape = edit
    state = dict(state)
    if kind == "delete":
        state.pop(key)
    elif kind in ("reshape", "add"):
        state[key] = torch.randn(shape)
    else:
        state = _renamed(state, f"blocks.{key}.", f"blocks.{to}.")
    return state


@pytest.mark.parametrize("fmt", ["ours", "timm"])
@FUZZ
@given(data=st.data())
def test_fuzz_tensors(tiny_state, fmt, data):
    edit = data.draw(state_edits(sorted(tiny_state)))
    state = _edited(tiny_state, edit)
    if fmt == "ours":
        model = _loaded_or_refused(model_from_state, state, {CONFIG_KEY: TINY.to_json()},
                                   source="fuzz")
    else:
        model = _loaded_or_refused(load_timm, _timm_state(state), source="fuzz", heads=3)
    if model is None:
        return
    _assert_consistent(model, state)


HF_FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "patch_size",
             "image_size", "intermediate_size", "num_channels", "qkv_bias", "layer_norm_eps",
             "hidden_act", "model_type", "mlp_ratio"]


@FUZZ
@given(field=st.sampled_from(HF_FIELDS), value=JSON_VALUES | st.sampled_from([48, 3, 8, 32]))
def test_fuzz_hf_config_field(hf_vit, field, value):
    reference = json.loads((hf_vit / "config.json").read_text())
    with tempfile.TemporaryDirectory() as d:
        directory = _hf_copy(hf_vit, Path(d) / "hf", {field: value})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = _loaded_or_refused(load_any, directory)
    if loaded is None:
        return
    model, fmt = loaded
    assert fmt == "hf"
    c = model.cfg
    assert (c.width, c.depth, c.heads, c.patch_size, c.in_chans, c.num_classes) == (
        48, 2, reference["num_attention_heads"] if field != "num_attention_heads" else value,
        8, 3, 5)
    expected, _ = load_any(hf_vit)
    _assert_consistent(model, expected.state_dict())


@pytest.mark.parametrize("kind", ["fifo", "broken link", "folder", "device link"])
def test_a_preprocessor_config_that_is_not_a_file_is_refused_not_ignored(tmp_path, hf_vit,
                                                                         kind):
    """Ignored, it exported ImageNet's preprocessing in place of the checkpoint's, exit 0
    (issue: a half-downloaded hub cache leaves a broken link). Now one line naming the file,
    exit 2, nothing written."""
    folder = _hf_copy(hf_vit, tmp_path / "vit")
    pre = folder / "preprocessor_config.json"
    {"fifo": lambda: os.mkfifo(pre), "broken link": lambda: pre.symlink_to(tmp_path / "gone"),
     "folder": lambda: pre.mkdir(), "device link": lambda: pre.symlink_to("/dev/zero")}[kind]()
    out = tmp_path / "bundle"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(folder), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "preprocessor_config.json" in r.output and "expected a regular file" in r.output
    assert "Traceback" not in r.output and not out.exists()
