"""The image towers people deploy now (CLIP, SigLIP / SigLIP 2, DINOv3 with a plain or a
gated MLP) reproduce transformers at any size, in PyTorch and in ONNX Runtime, pooled and
dense, and survive int8.

Random-weight small configs (32 wide, 2 layers, patch 8, native 32x32), saved with
save_pretrained and loaded back through our loader, as tests/export/test_checkpoints.py does
for ViT / DeiT / DINOv2."""

import shutil
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.export.checkpoints import CheckpointError, CheckpointWarning, load_any
from vit_deploy.export.model import ViTOutputs
from vit_deploy.export.rope import rope_angles
from vit_deploy.precisions.add import add_precisions
from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import MODEL_FILE
from vit_deploy.runtime.manifest import load_manifest

import transformers as T  # noqa: E402  (the test extra installs it)

P = 8
SIZES = [(32, 32), (48, 64), (40, 40), (24, 16)]  # native, non-square larger, square, smaller
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             patch_size=P)
TOWERS = {
    "CLIPVisionModelWithProjection": lambda: T.CLIPVisionModelWithProjection(
        T.CLIPVisionConfig(**SMALL, image_size=32, projection_dim=24)),
    "CLIPVisionModel": lambda: T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL, image_size=32)),
    "SiglipVisionModel": lambda: T.SiglipVisionModel(T.SiglipVisionConfig(**SMALL, image_size=32)),
    "Siglip2VisionModel": lambda: T.Siglip2VisionModel(
        T.Siglip2VisionConfig(**SMALL, num_patches=16)),
    "DINOv3ViTModel": lambda: T.DINOv3ViTModel(
        T.DINOv3ViTConfig(**SMALL, image_size=32, num_register_tokens=2)),
    # the H+ / 7B kind: SwiGLU (use_gated_mlp, hidden_act silu), registers, rotary positions
    "DINOv3ViTModel-gated": lambda: T.DINOv3ViTModel(
        T.DINOv3ViTConfig(**SMALL, image_size=32, num_register_tokens=2, use_gated_mlp=True,
                          hidden_act="silu")),
}
DINOV3 = ("DINOv3ViTModel", "DINOv3ViTModel-gated")
# What each exports: pooled and the patch tokens on the grid; DINOv3 also its class token
# and registers (as DINOv2).
OUTPUTS = {name: ("pooled", "patch_tokens") for name in TOWERS}
OUTPUTS.update({name: ("pooled", "patch_tokens", "class_token", "register_tokens")
                for name in DINOV3})


def as_siglip2_patches(x: torch.Tensor) -> dict:
    """An image batch (B, C, H, W) in Siglip2VisionModel's input form: patches flattened
    (row, column, channel) as its image processor does, every patch real (mask all ones),
    the grid of each image in spatial_shapes."""
    B, C, H, W = x.shape
    gh, gw = H // P, W // P
    patches = x.reshape(B, C, gh, P, gw, P).permute(0, 2, 4, 3, 5, 1).reshape(B, gh * gw, -1)
    return dict(pixel_values=patches, pixel_attention_mask=torch.ones(B, gh * gw, dtype=torch.long),
                spatial_shapes=torch.tensor([[gh, gw]] * B))


def reference(name: str, model, x: np.ndarray, prefix: int) -> dict[str, np.ndarray]:
    """transformers' outputs under our names: pooled (the image embedding with a projection,
    else pooler_output), patch_tokens (last_hidden_state's patches on the grid), ..."""
    t = torch.from_numpy(x)
    with torch.no_grad():
        if name == "Siglip2VisionModel":
            out = model(**as_siglip2_patches(t))
        elif name in DINOV3:
            out = model(pixel_values=t)
        else:
            out = model(pixel_values=t, interpolate_pos_encoding=True)
    pooled = getattr(out, "image_embeds", None)
    last = out.last_hidden_state
    B, gh, gw = x.shape[0], x.shape[2] // P, x.shape[3] // P
    return {"pooled": (pooled if pooled is not None else out.pooler_output).numpy(),
            "patch_tokens": last[:, prefix:].transpose(1, 2).reshape(B, -1, gh, gw).numpy(),
            "class_token": last[:, 0].numpy(), "register_tokens": last[:, 1:prefix].numpy()}


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    """{name: (transformers model, directory, our model)}: random weights moved off their
    init (nothing matches by accident), saved with save_pretrained, loaded by our loader."""
    out = {}
    for name, make in TOWERS.items():
        torch.manual_seed(0)
        model = make().eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        directory = tmp_path_factory.mktemp("hf") / name
        model.save_pretrained(directory)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointWarning)
            ours, fmt = load_any(directory)
        assert fmt == "hf"
        out[name] = (model, directory, ours)
    return out


def _gap(mine: np.ndarray, ref: np.ndarray) -> float:
    """max |Δ| relative to the policy's scale, max(1, max |ref|)."""
    return float(np.abs(mine - ref).max() / max(1.0, float(np.abs(ref).max())))


@pytest.fixture(scope="module")
def bundles(towers, tmp_path_factory):
    """{name: bundle directory}: each tower through the whole export (one manifest), its
    outputs OUTPUTS[name]; the exporter's own parity against our PyTorch model passed."""
    out = {}
    for name, (_, _, ours) in towers.items():
        result = export_bundle(ours, tmp_path_factory.mktemp("bundle") / name,
                               options=ExportOptions(simplify=False, outputs=OUTPUTS[name]))
        assert result.report and result.manifest.config == ours.cfg
        out[name] = result.path
    return out


@pytest.mark.parametrize("name", list(TOWERS))
def test_tower_matches_transformers_in_torch_and_onnx(towers, bundles, name):
    hf, _, ours = towers[name]
    names = OUTPUTS[name]
    session = ort.InferenceSession(str(bundles[name] / MODEL_FILE),
                                   providers=["CPUExecutionProvider"])
    wrapper = ViTOutputs(ours, names).eval()
    rng = np.random.default_rng(0)
    for hw in SIZES:
        x = rng.standard_normal((2, 3, *hw), dtype=np.float32)
        ref = reference(name, hf, x, ours.cfg.num_prefix_tokens)
        with torch.no_grad():
            mine = [t.numpy() for t in wrapper(torch.from_numpy(x))]
        onnx_out = session.run(list(names), {"pixel_values": x})
        for n, a, b in zip(names, mine, onnx_out):
            assert a.shape == ref[n].shape, (name, hw, n)
            assert _gap(a, ref[n]) <= 1e-5, (name, hw, n, _gap(a, ref[n]))
            assert _gap(b, ref[n]) <= 1e-4, (name, hw, n, _gap(b, ref[n]))


def test_what_each_tower_became(towers):
    cfg = {name: towers[name][2].cfg for name in TOWERS}
    clip = cfg["CLIPVisionModelWithProjection"]
    assert (clip.act, clip.pre_norm, clip.patch_bias, clip.proj_dim, clip.fc_norm) == (
        "quick_gelu", True, False, 24, True)
    assert (clip.mean[0], clip.std[0]) == (0.48145466, 0.26862954)  # OpenAI CLIP's statistics
    assert cfg["CLIPVisionModel"].proj_dim == 0 and cfg["CLIPVisionModel"].pooled_dim == 32
    for name, interp, antialias in (("SiglipVisionModel", "bicubic", False),
                                    ("Siglip2VisionModel", "bilinear", True)):
        c = cfg[name]
        assert (c.pool, c.class_token, c.act, c.pos_interp, c.pos_antialias) == (
            "map", False, "gelu_tanh", interp, antialias)
    dino = cfg["DINOv3ViTModel"]
    assert (dino.pos_embed, dino.num_registers, dino.layer_scale, dino.qkv_bias, dino.mlp,
            dino.act) == ("rope", 2, True, True, "plain", "gelu")
    gated = cfg["DINOv3ViTModel-gated"]
    assert (gated.pos_embed, gated.num_registers, gated.mlp, gated.act, gated.mlp_ratio) == (
        "rope", 2, "gated", "silu", 2.0)


def test_tower_configs_round_trip_and_old_configs_load():
    clip = ViTConfig(width=32, depth=1, heads=2, num_classes=0, act="quick_gelu", pre_norm=True,
                     patch_bias=False, proj_dim=24, fc_norm=True)
    assert ViTConfig.from_json(clip.to_json()) == clip
    old = {k: v for k, v in clip.to_dict().items()
           if k not in ("act", "pre_norm", "patch_bias", "proj_dim", "rope_theta")}
    assert ViTConfig.from_dict(old).act == "gelu"  # bundles written before the fields load
    with pytest.raises(ValueError, match="act must be one of"):
        ViTConfig(act="relu")
    with pytest.raises(ValueError, match="no classifier after it"):
        ViTConfig(proj_dim=24, num_classes=10)
    with pytest.raises(ValueError, match="head dim divisible by 4"):
        ViTConfig(width=36, heads=6, pos_embed="rope")
    with pytest.raises(ValueError, match="token merging is not supported"):
        ViTConfig(depth=1, pos_embed="rope", merge=(2,))


def test_rope_angles_are_transformers_at_any_grid():
    from transformers.models.dinov3_vit.modeling_dinov3_vit import get_patches_center_coordinates

    inv_freq = 1 / 100.0 ** torch.arange(0, 1, 4 / 16, dtype=torch.float32)
    for grid in [(4, 4), (3, 7), (1, 1)]:
        coords = get_patches_center_coordinates(*grid, dtype=torch.float32, device="cpu")
        theirs = (2 * np.pi * coords[:, :, None] * inv_freq[None, None, :]).flatten(1, 2).tile(2)
        torch.testing.assert_close(rope_angles(grid, inv_freq), theirs, rtol=0, atol=0)


def test_a_gate_the_weights_lack_and_lying_tables_are_refused(towers, tmp_path):
    directory = tmp_path / "gated"
    shutil.copytree(towers["DINOv3ViTModel"][1], directory)
    text = (directory / "config.json").read_text()
    (directory / "config.json").write_text(text.replace('"use_gated_mlp": false',
                                                        '"use_gated_mlp": true'))
    with pytest.raises(CheckpointError, match=r"needs tensors its weights lack: .*mlp\.gate_proj"):
        load_any(directory)
    directory = tmp_path / "siglip2"
    shutil.copytree(towers["Siglip2VisionModel"][1], directory)
    text = (directory / "config.json").read_text()
    (directory / "config.json").write_text(text.replace('"num_patches": 16', '"num_patches": 25'))
    with pytest.raises(CheckpointError, match="num_patches 25, its position table holds 16"):
        load_any(directory)


INT8 = ["CLIPVisionModelWithProjection", "SiglipVisionModel", "Siglip2VisionModel",
        "DINOv3ViTModel", "DINOv3ViTModel-gated"]


@pytest.mark.parametrize("name", INT8)
def test_int8_bundle_keeps_the_embedding(towers, bundles, name, tmp_path):
    """The bundle's int8 precision (dynamic, the encoder's linear layers), judged by the
    cosine of every output to fp32 at the bundle's parity sizes."""
    ours = towers[name][2]
    shutil.copytree(bundles[name], tmp_path / "b")
    [int8] = add_precisions(tmp_path / "b", ["int8"])
    cosine = min(c.cosine for c in int8.parity.cases)
    assert int8.passed and cosine >= 0.99, (name, cosine, int8.notes)
    manifest = load_manifest(tmp_path / "b")
    assert set(manifest.models) == {"fp32", "int8"}
    assert manifest.config == ours.cfg
    print(f"{name}: int8 cosine {cosine:.5f}")
