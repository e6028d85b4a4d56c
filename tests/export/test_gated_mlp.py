"""DINOv3's gated MLP (SwiGLU: use_gated_mlp, hidden_act silu; the H+ / 7B models) beyond
the parity of tests/export/test_families.py (which holds the gated tower to transformers at
four sizes in PyTorch and ONNX Runtime, and its int8): the config field, our safetensors
round trip, a save_pretrained directory through `vit-deploy export --checkpoint DIR`, the
bias-free variant, and the checkpoints that are refused, each with one clear sentence."""

import json
import shutil
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from vit_deploy.cli import main
from vit_deploy.export.checkpoints import (CheckpointError, CheckpointWarning, load_any,
                                           load_model, save_weights)
from vit_deploy.export.checkpoints.metadata import config_metadata
from vit_deploy.export.model import ViTOutputs, build_model
from vit_deploy.runtime.config import MLPS, ViTConfig
from vit_deploy.runtime.contract import MODEL_FILE
from vit_deploy.runtime.manifest import load_manifest

import transformers as T  # noqa: E402  (the test extra installs it)

P = 8
GATED = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             patch_size=P, image_size=32, num_register_tokens=2, use_gated_mlp=True,
             hidden_act="silu")
NAMES = ("pooled", "patch_tokens", "class_token", "register_tokens")


def _saved(directory, **changes):
    """A random-weight DINOv3ViTModel (weights moved off their init), saved with
    save_pretrained into `directory`."""
    torch.manual_seed(0)
    model = T.DINOv3ViTModel(T.DINOv3ViTConfig(**{**GATED, **changes})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(directory)
    return model


def _load(directory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)  # the unused mask_token
        return load_any(directory)[0]


def _theirs(model, x: np.ndarray, prefix: int) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
    last = out.last_hidden_state
    B, gh, gw = x.shape[0], x.shape[2] // P, x.shape[3] // P
    return {"pooled": out.pooler_output.numpy(),
            "patch_tokens": last[:, prefix:].transpose(1, 2).reshape(B, -1, gh, gw).numpy(),
            "class_token": last[:, 0].numpy(), "register_tokens": last[:, 1:prefix].numpy()}


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """(transformers model, its directory, ours)."""
    directory = tmp_path_factory.mktemp("hf") / "dinov3-gated"
    model = _saved(directory)
    return model, directory, _load(directory)


def test_the_config_says_gated_and_old_configs_are_plain():
    cfg = ViTConfig(width=32, depth=1, heads=2, num_classes=0, mlp="gated", act="silu",
                    pos_embed="rope", num_registers=2)
    assert ViTConfig.from_json(cfg.to_json()) == cfg
    old = {k: v for k, v in cfg.to_dict().items() if k != "mlp"}
    assert ViTConfig.from_dict(old).mlp == "plain"  # bundles written before the field load
    assert MLPS == ("plain", "gated")
    with pytest.raises(ValueError, match=r"mlp must be one of \('plain', 'gated'\), got 'swiglu'"):
        ViTConfig(mlp="swiglu")
    with pytest.raises(ValueError, match="mlp must be a string, got 3"):
        ViTConfig.from_dict({**cfg.to_dict(), "mlp": 3})
    model = build_model(cfg)
    assert tuple(model.blocks[0].mlp.gate_fc1.weight.shape) == (2 * 128, 32)  # [gate; up]
    assert not hasattr(model.blocks[0].mlp, "fc1")


def test_the_gated_tower_is_transformers_bit_for_bit(gated):
    hf, _, ours = gated
    assert (ours.cfg.mlp, ours.cfg.act, ours.cfg.mlp_ratio, ours.cfg.num_registers) == (
        "gated", "silu", 2.0, 2)
    x = np.random.default_rng(1).standard_normal((3, 3, 40, 24), dtype=np.float32)
    ref = _theirs(hf, x, ours.cfg.num_prefix_tokens)
    with torch.no_grad():
        mine = ViTOutputs(ours, NAMES).eval()(torch.from_numpy(x))
    for name, a in zip(NAMES, mine):
        np.testing.assert_array_equal(a.numpy(), ref[name], err_msg=name)


def test_our_safetensors_round_trip_keeps_the_gate(gated, tmp_path):
    _, _, ours = gated
    path = save_weights(ours, tmp_path / "gated.safetensors")
    loaded = load_model(path)
    assert loaded.cfg == ours.cfg and loaded.cfg.mlp == "gated"
    x = torch.randn(2, 3, 24, 48)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), ours(x), rtol=0, atol=0)
    again, fmt = load_any(path)
    assert fmt == "vit-deploy" and again.cfg == ours.cfg
    # a gated config over plain weights names the layer it misses and the one it does not use
    plain = build_model(ours.cfg.replace(mlp="plain", act="gelu"))
    state = {k: v.contiguous() for k, v in plain.state_dict().items()}
    save_file(state, str(tmp_path / "plain.safetensors"), metadata=config_metadata(ours.cfg))
    with pytest.raises(CheckpointError, match=r"missing keys: .*mlp\.gate_fc1.*unexpected keys: "
                                              r".*mlp\.fc1"):
        load_model(tmp_path / "plain.safetensors")


@pytest.mark.filterwarnings("ignore::vit_deploy.export.checkpoints.CheckpointWarning")
def test_a_hub_style_directory_exports_through_the_cli(gated, tmp_path):
    """config.json + model.safetensors from save_pretrained, through `vit-deploy export
    --checkpoint DIR`; the bundle's graph runs a batch and a grid it was not exported at."""
    hf, directory, ours = gated
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors"]
    out = tmp_path / "bundle"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(directory), "--res", "48x64",
                                  "--outputs", ",".join(NAMES), "--no-simplify",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "hf format" in r.output and "parity: PASS" in r.output
    manifest = load_manifest(out)
    assert manifest.config == ours.cfg and manifest.config.mlp == "gated"
    assert json.loads((out / "manifest.json").read_text())["config"]["mlp"] == "gated"
    session = ort.InferenceSession(str(out / MODEL_FILE), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((3, 3, 56, 24), dtype=np.float32)
    ref = _theirs(hf, x, ours.cfg.num_prefix_tokens)
    for name, got in zip(NAMES, session.run(list(NAMES), {"pixel_values": x})):
        assert got.shape == ref[name].shape, name
        gap = np.abs(got - ref[name]).max() / max(1.0, np.abs(ref[name]).max())
        assert gap <= 1e-4, (name, gap)


def test_without_mlp_biases_the_gate_has_zeros(tmp_path):
    hf = _saved(tmp_path / "nobias", mlp_bias=False)
    ours = _load(tmp_path / "nobias")
    assert not ours.blocks[0].mlp.gate_fc1.bias.any() and not ours.blocks[1].mlp.fc2.bias.any()
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 48), dtype=np.float32)
    with torch.no_grad():
        mine = ours.forward_features(torch.from_numpy(x)).numpy()
        theirs = hf(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    np.testing.assert_array_equal(mine, theirs)


def _edited(gated, tmp_path, *, config=None, tensors=None):
    directory = tmp_path / "edited"
    shutil.copytree(gated[1], directory)
    if config is not None:
        path = directory / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if tensors is not None:
        path = directory / "model.safetensors"
        save_file({**load_file(str(path)), **tensors}, str(path), metadata={"format": "pt"})
    return directory


@pytest.mark.parametrize("config, tensors, message", [
    ({"use_gated_mlp": "yes"}, None, r"use_gated_mlp must be true or false, got 'yes'"),
    ({"hidden_act": "relu"}, None,
     r"hidden_act must be one of \[.*'silu'.*\], the checkpoint uses 'relu' in a gated MLP"),
    ({"hidden_act": ["silu"]}, None,
     r"hidden_act must be one of .*, the checkpoint uses \['silu'\]"),
    ({"use_gated_mlp": False}, None,
     r"its weights hold tensors the dinov3_vit mapping does not use: .*mlp\.gate_proj"),
    (None, {"layer.1.mlp.gate_proj.weight": torch.zeros(64, 30)},
     r"blocks\.1\.mlp\.gate_fc1\.weight is layer\.1\.mlp\.gate_proj\.weight, "
     r"layer\.1\.mlp\.up_proj\.weight stacked, .* their shapes are \(64, 30\), \(64, 32\)"),
    (None, {"layer.0.mlp.gate_proj.weight": torch.zeros(48, 32)},
     r"shape mismatch: \['blocks\.0\.mlp\.gate_fc1\.weight \(from layer\.0\.mlp\.gate_proj\."
     r"weight, layer\.0\.mlp\.up_proj\.weight\): checkpoint \(112, 32\) vs expected \(128, 32\)"),
    ({"intermediate_size": 48}, None,
     r"shape mismatch: \['blocks\.0\.mlp\.gate_fc1\.weight .*: checkpoint \(128, 32\) vs "
     r"expected \(96, 32\)"),
], ids=["not-a-bool", "relu", "not-a-string", "gate-not-declared", "gate-width",
        "gate-rows", "intermediate-size"])
def test_gated_checkpoints_that_disagree_are_refused(gated, tmp_path, config, tensors, message):
    directory = _edited(gated, tmp_path, config=config, tensors=tensors)
    with pytest.raises(CheckpointError, match=message):
        _load(directory)


def test_only_dinov3_reads_use_gated_mlp(tmp_path):
    directory = tmp_path / "clip"
    T.CLIPVisionModel(T.CLIPVisionConfig(hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         patch_size=P, image_size=32)).save_pretrained(directory)
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "use_gated_mlp": True}))
    with pytest.raises(CheckpointError, match="use_gated_mlp is read for DINOv3 only, not "
                                              "clip_vision_model"):
        _load(directory)
