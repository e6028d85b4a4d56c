"""Dense outputs: patch tokens on the grid, class / register tokens, intermediate layers —
against our own token sequence, Hugging Face DINOv2 / ViT, and through every tool."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from vit_deploy.cli import main
from vit_deploy.runtime.config import variant
from vit_deploy.runtime.contract import GRID_H_DIM, GRID_W_DIM
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.export.checkpoints import load_any
from vit_deploy.export.model import ViTOutputs, build_model, numpy_forward
from vit_deploy.export.onnx import OnnxOptions, export_onnx
from vit_deploy.outputs import parse_layers, select_outputs
from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.session import InputError

import transformers  # noqa: E402  (the test extra installs it)

SIZES = [(32, 32), (40, 56), (24, 16)]  # native, non-square larger, smaller


def _cfg(**changes):
    base = dict(depth=3, width=48, heads=3, img_size=(32, 32), num_classes=5)
    return variant("S/8", **{**base, **changes})


def test_outputs_are_slices_of_the_token_sequence():
    """cls | dist | registers | patches (raster order): each output is its part, normed."""
    cfg = _cfg(dist_token=True, num_registers=2, pos_prefix_tokens=2)
    model = build_model(cfg, seed=1)
    names = ("logits", "pooled", "patch_tokens", "class_token", "register_tokens", "layer_2")
    wrapped = ViTOutputs(model, names)
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        out = dict(zip(names, wrapped(x)))
        tokens, (second,), _ = model.forward_tokens(x, (2,))
        logits = model(x)
    gh, gw = 5, 7
    assert tokens.shape == (2, 4 + gh * gw, 48)
    torch.testing.assert_close(out["logits"], logits, rtol=0, atol=0)
    torch.testing.assert_close(out["class_token"], tokens[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(out["register_tokens"], tokens[:, 2:4], rtol=0, atol=0)
    assert out["patch_tokens"].shape == (2, 48, gh, gw)
    # cell (i, j) of the grid is patch token i * gw + j
    for i, j in [(0, 0), (0, 6), (4, 0), (3, 5)]:
        torch.testing.assert_close(out["patch_tokens"][:, :, i, j], tokens[:, 4 + i * gw + j],
                                   rtol=0, atol=0)
    normed = model.norm(second)
    torch.testing.assert_close(out["layer_2"][:, :, 3, 5], normed[:, 4 + 3 * gw + 5], rtol=0, atol=0)
    with torch.no_grad():
        raw = dict(zip(names, ViTOutputs(model, names, layer_norm=False)(x)))
    torch.testing.assert_close(raw["layer_2"][:, :, 1, 2], second[:, 4 + 1 * gw + 2], rtol=0, atol=0)
    # the last block's raw tokens, normed, are the final patch tokens
    last = dict(zip(("patch_tokens", "layer_3"), ViTOutputs(model, ("patch_tokens", "layer_3"))(x)))
    torch.testing.assert_close(last["layer_3"], last["patch_tokens"], rtol=0, atol=0)


@pytest.mark.parametrize("requested,layers,message", [
    (("logits", "depth"), (), "unknown output"),
    (("class_token",), (), None),
    (("register_tokens",), (), "no register tokens"),
    (None, (0,), r"block numbers 1\.\.3"),
    (None, (4,), r"block numbers 1\.\.3"),
    (("patch_tokens", "patch_tokens"), (), "asked for twice"),
])
def test_output_selection_is_checked(requested, layers, message):
    cfg = _cfg()
    if message is None:
        assert select_outputs(cfg, requested, layers=layers).names == ("class_token",)
        return
    with pytest.raises(ValueError, match=message):
        select_outputs(cfg, requested, layers=layers)
    with pytest.raises(ValueError, match="no classifier"):
        select_outputs(_cfg(num_classes=0), ("logits",))
    with pytest.raises(ValueError, match="block numbers like 3,6,9,12"):
        parse_layers("3,six")


def test_defaults_logits_for_a_classifier_and_dense_for_a_backbone():
    assert select_outputs(_cfg()).names == ("logits",)
    assert select_outputs(_cfg(), features=True).names == ("logits", "pooled")
    assert select_outputs(_cfg(num_classes=0)).names == ("pooled", "patch_tokens")


# -- Hugging Face --------------------------------------------------------------------------
SMALL = dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=3, image_size=32,
             patch_size=8)


def _hf(name):
    T = transformers
    torch.manual_seed(0)
    if name == "Dinov2Model":
        config = T.Dinov2Config(**SMALL, mlp_ratio=4, out_indices=[1, 3])
        model, backbone = T.Dinov2Model(config), T.Dinov2Backbone(config)
    elif name == "Dinov2WithRegistersModel":
        config = T.Dinov2WithRegistersConfig(**SMALL, mlp_ratio=4, num_register_tokens=2,
                                             out_indices=[1, 3])
        model, backbone = T.Dinov2WithRegistersModel(config), T.Dinov2WithRegistersBackbone(config)
    else:
        model = T.ViTModel(T.ViTConfig(**SMALL, intermediate_size=192), add_pooling_layer=False)
        backbone = None
    with torch.no_grad():  # move every weight off its init so nothing matches by accident
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.eval()
    if backbone is not None:
        missing = backbone.load_state_dict(model.state_dict(), strict=False)
        assert not missing.missing_keys and not missing.unexpected_keys
        backbone.eval()
    return model, backbone


@pytest.mark.parametrize("name", ["Dinov2Model", "Dinov2WithRegistersModel", "ViTModel"])
def test_dense_outputs_match_transformers(name, tmp_path):
    """patch_tokens = last_hidden_state without prefix tokens, on the grid; layer_N =
    Dinov2Backbone's feature maps (normed), or hidden_states[N] (ViT, not normed);
    register_tokens and class_token are their rows. In PyTorch and in ONNX Runtime."""
    hf, backbone = _hf(name)
    hf.save_pretrained(tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, _ = load_any(tmp_path / "hf")
    dino = backbone is not None
    regs = ours.cfg.num_registers
    names = ["patch_tokens", "class_token"] + (["register_tokens"] if regs else [])
    selection = select_outputs(ours.cfg, names, layers=(1, 3), layer_norm=dino)
    path = export_onnx(ours, tmp_path / "dense.onnx", options=OnnxOptions(outputs=selection))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    torch_forward = numpy_forward(ViTOutputs(ours, selection.names, layer_norm=dino))
    rng = np.random.default_rng(0)
    for hw in SIZES:
        x = rng.standard_normal((2, 3, *hw), dtype=np.float32)
        gh, gw = hw[0] // 8, hw[1] // 8
        with torch.no_grad():
            ref = hf(pixel_values=torch.from_numpy(x), output_hidden_states=True,
                     **({} if dino else {"interpolate_pos_encoding": True}))
            maps = backbone(pixel_values=torch.from_numpy(x)).feature_maps if dino else None
        last = ref.last_hidden_state.numpy()  # (B, T, D), final-normed
        prefix = 1 + regs
        expected = {"patch_tokens": last[:, prefix:].reshape(2, gh, gw, 48).transpose(0, 3, 1, 2),
                    "class_token": last[:, 0]}
        if regs:
            expected["register_tokens"] = last[:, 1:prefix]
        for block, i in ((1, 0), (3, 1)):
            if dino:
                expected[f"layer_{block}"] = maps[i].numpy()
            else:
                hidden = ref.hidden_states[block].numpy()  # the output of block `block`
                expected[f"layer_{block}"] = hidden[:, 1:].reshape(2, gh, gw, 48).transpose(0, 3, 1, 2)
        mine = torch_forward(x)
        onnx_out = dict(zip(selection.names, session.run(None, {"pixel_values": x})))
        assert set(expected) == set(selection.names)
        for key, want in expected.items():
            assert mine[key].shape == want.shape, (key, hw)
            assert np.abs(mine[key] - want).max() <= 1e-4, (name, key, hw)
            assert np.abs(onnx_out[key] - want).max() <= 1e-4, (name, key, hw)


# -- bundles, the runtime and the CLI ---------------------------------------------------------
@pytest.fixture(scope="module")
def dense_bundle(tmp_path_factory):
    cfg = _cfg(num_classes=0, num_registers=2, pos_prefix_tokens=1)
    model = build_model(cfg, seed=4)
    out = tmp_path_factory.mktemp("dense") / "bundle"
    result = export_bundle(model, out, options=ExportOptions(
        resolution=(32, 48), layers=(2,), simplify=False,
        outputs=("pooled", "patch_tokens", "register_tokens")))
    return model, result


def test_bundle_declares_dense_outputs_and_checks_each(dense_bundle):
    _, result = dense_bundle
    manifest = load_manifest(result.path)
    shapes = {o.name: o.shape for o in manifest.io.outputs}
    assert shapes == {"pooled": ("batch", 48), "patch_tokens": ("batch", 48, GRID_H_DIM, GRID_W_DIM),
                      "register_tokens": ("batch", 2, 48),
                      "layer_2": ("batch", 48, GRID_H_DIM, GRID_W_DIM)}
    assert manifest.io.layer_norm is True
    compared = {c.output for c in result.report.cases}
    assert compared == set(shapes)
    assert all(c.top1_agree is None for c in result.report.cases)  # only logits have a top-1
    graph = ort.InferenceSession(str(manifest.model_path(result.path, "fp32")),
                                 providers=["CPUExecutionProvider"])
    assert [o.shape for o in graph.get_outputs()][1] == ["batch", 48, GRID_H_DIM, GRID_W_DIM]


def test_static_export_has_a_fixed_grid(tmp_path):
    model = build_model(_cfg(num_classes=0), seed=2)
    result = export_bundle(model, tmp_path / "s", options=ExportOptions(
        resolution=(24, 40), static=True, simplify=False))
    assert load_manifest(result.path).io.output("patch_tokens").shape == ("batch", 48, 3, 5)


def _photo(tmp_path, name, size):
    rng = np.random.default_rng(sum(size))
    y, x = np.mgrid[:size[1], :size[0]]
    img = np.stack([x * 255 // size[0], y * 255 // size[1], rng.integers(0, 255, (size[1], size[0]))],
                   -1).astype(np.uint8)
    path = tmp_path / name
    Image.fromarray(img).save(path)
    return path


def test_session_features_keep_the_aspect_ratio(dense_bundle, tmp_path):
    model, result = dense_bundle
    wide, tall = _photo(tmp_path, "wide.png", (90, 50)), _photo(tmp_path, "tall.png", (40, 100))
    with ViTSession(result.path) as s:
        # shorter side to the deploy resolution's shorter side (32), both sides patch multiples
        grid = s.features(wide)
        assert grid.shape == (1, 48, 4, 7)  # 32 x 56 pixels
        assert s.features(tall).shape == (1, 48, 10, 4)  # 80 x 32
        assert s.features([wide, wide]).shape == (2, 48, 4, 7)
        assert s.features(wide, output="layer_2").shape == (1, 48, 4, 7)
        pixels = s.preprocess(resize="patch_multiple")(wide)[None]
        with torch.no_grad():
            ref = model.patch_grid(model.forward_features(torch.from_numpy(pixels)), (4, 7)).numpy()
        assert np.abs(grid - ref).max() <= 1e-4
        with pytest.raises(InputError, match="2 sizes"):
            s.features([wide, tall])
        with pytest.raises(InputError, match="no images"):
            s.features([])


def test_predict_writes_features(dense_bundle, tmp_path):
    _, result = dense_bundle
    wide, tall = _photo(tmp_path, "wide.png", (90, 50)), _photo(tmp_path, "tall.png", (40, 100))
    runner = CliRunner()
    out = tmp_path / "f.npz"
    r = runner.invoke(main, ["predict", str(result.path), str(wide), str(tall),
                             "--features", str(out)])
    assert r.exit_code == 0, r.output
    saved = np.load(out)
    with ViTSession(result.path) as s:
        np.testing.assert_allclose(saved["patch_tokens_0"], s.features(wide)[0], atol=1e-6)
        np.testing.assert_allclose(saved["layer_2_1"], s.features(tall, output="layer_2")[0],
                                   atol=1e-6)
    assert list(saved["sources"]) == [str(wide), str(tall)]
    before = out.read_bytes()
    again = runner.invoke(main, ["predict", str(result.path), str(wide), "--features", str(out)])
    assert again.exit_code == 2 and "exists; pass --force" in again.output
    assert out.read_bytes() == before  # the user's file is untouched
    bare = runner.invoke(main, ["predict", str(result.path), str(wide)])
    assert bare.exit_code == 2 and "has no classifier" in bare.output
    bad = runner.invoke(main, ["export", "--model", "tiny", "--outputs", "logits,depth",
                               "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown output(s) ['depth']" in bad.output
    assert not (tmp_path / "x").exists()


def test_quantised_dense_outputs_are_judged_by_cosine(dense_bundle, tmp_path):
    import shutil

    from vit_deploy.precisions.add import PrecisionOptions, add_precisions

    _, result = dense_bundle
    copy = tmp_path / "q"
    shutil.copytree(result.path, copy)
    add_precisions(copy, ["int8"], options=PrecisionOptions())
    manifest = load_manifest(copy)
    judged = {c["output"] for c in manifest.precisions["int8"]["parity"]["cases"]}
    assert judged == {"pooled", "patch_tokens", "register_tokens", "layer_2"}
    assert all(c["abs_tol"] is None and c["cosine"] >= 0.99
               for c in manifest.precisions["int8"]["parity"]["cases"])


def test_feature_pca_example(dense_bundle, tmp_path):
    """examples/feature_pca.py: three principal components of the patch features as
    colours, beside the image; patches that look alike get alike colours."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "feature_pca", Path(__file__).parents[2] / "examples" / "feature_pca.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # two kinds of patch: a grid whose left half and right half differ
    grid = np.zeros((16, 4, 6))
    grid[:, :, :3] = np.random.default_rng(0).normal(size=(16, 1, 1))
    grid += np.random.default_rng(1).normal(scale=1e-3, size=grid.shape)
    red = example.principal_colours(grid)[..., 0].astype(int)  # the first component
    left, right = red[:, :3], red[:, 3:]
    assert abs(left.mean() - right.mean()) > 200  # the two kinds at opposite ends
    assert np.ptp(left) < 30 and np.ptp(right) < 30  # alike within each kind
    image = _photo(tmp_path, "wide.png", (90, 50))
    out = tmp_path / "pca.png"
    assert example.main([str(dense_bundle[1].path), str(image), str(out)]) == 0
    picture = Image.open(out)
    assert picture.size == (2 * round(90 * 256 / 50) + 8, 256)
    assert example.main([str(dense_bundle[1].path), str(tmp_path / "missing.png"),
                         str(tmp_path / "no.png")]) == 1
    assert not (tmp_path / "no.png").exists()
