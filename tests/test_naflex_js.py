"""SigLIP 2 NaFlex in JavaScript (web/src/lib/naflex.mjs) against Python, in Node.

Preprocessing: the 12 shipped photographs and synthetic sizes (thin strips, one pixel, large,
an RGBA image) at 64, 256 and 1024 patches, one mixed-aspect batch each, against
vit_deploy.runtime.naflex.preprocess.NaFlexPreprocess (itself equal to transformers'
Siglip2ImageProcessorPil: tests/runtime/test_naflex_preprocess.py): the same floats, mask and
grids, bit for bit. Both sides start from the same pixels: the photographs as Pillow decodes
them (libjpeg-turbo), sent to Node as raw RGB; the synthetic images as PNG files that Node
decodes itself (pngjs). Node's own JPEG decoder (jpeg-js: no "fancy" chroma upsampling)
differs from libjpeg-turbo by a few levels: measured separately, and bounded.

Inference: a tiny random Siglip2VisionModel exported by export_naflex, run by
naflexFeatures in onnxruntime-node and by NaFlexSession in Python's onnxruntime, single
images and mixed-aspect batches: pooled and patch tokens within 1e-5 relative.
"""

from __future__ import annotations

import json
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from web_node import node as _node
from PIL import Image

from vit_deploy.data import photo_paths
from vit_deploy.runtime.naflex.preprocess import NaFlexPreprocess
from vit_deploy.runtime.preprocess import load_image

pytestmark = pytest.mark.heavy  # Node, and an export (~15 s)

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
PHOTOS = sorted(photo_paths("calib", core=True) + photo_paths("eval", core=True))
SYNTHETIC = [(50, 120), (300, 40), (17, 17), (1, 500), (500, 1), (640, 480), (33, 1000),
             (16, 16), (15, 17), (2000, 40), (1, 1)]  # (height, width), RGB
RGBA = (37, 81)  # one more, with an alpha channel (composited on white on both sides)
BUDGETS = (64, 256, 1024)
RTOL = 1e-5  # ONNX outputs: max abs difference / max abs of Python's
JPEG_LEVELS = 40  # jpeg-js vs libjpeg-turbo, in 8-bit levels (web/test/preprocess.test.mjs)

# The Node side: what job.json asks, written as raw little-endian arrays into job.out.
DRIVER = r"""
import fs from 'node:fs';
import path from 'node:path';
const web = await import(process.argv[3]);
const job = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const write = (name, a) => fs.writeFileSync(path.join(job.out, name), new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
const load = async ({ rgb, file, width, height }) => (rgb
  ? { data: new Uint8Array(fs.readFileSync(rgb)), width, height, channels: 3 }
  : web.decodeImage(file));
const images = await Promise.all(job.images.map(load));
const timing = {};
for (const n of job.budgets) {
  const t0 = performance.now();
  const b = new web.NaFlexPreprocess({ maxNumPatches: n }).batch(images);
  timing[n] = performance.now() - t0;
  write(`values_${n}.f32`, b.pixelValues.data);
  write(`mask_${n}.i32`, b.pixelAttentionMask.data);
  write(`shapes_${n}.i64`, b.spatialShapes.data);
}
const jpegs = await Promise.all(job.jpegs.map((f) => web.decodeImage(f)));
write('jpeg.f32', new web.NaFlexPreprocess({ maxNumPatches: job.jpegBudget }).batch(jpegs).pixelValues.data);
for (const [i, { budget, picks }] of job.cases.entries()) {
  const f = await web.naflexFeatures(job.model, picks.map((p) => images[p]), { maxNumPatches: budget, threads: 1 });
  write(`pooled_${i}.f32`, f.pooled.data);
  f.tokens.forEach((t, j) => write(`tokens_${i}_${j}.f32`, t.data));
}
const naflex = await web.NaFlex.load(path.dirname(job.model), { maxNumPatches: 64 });
const refused = await web.NaFlex.load(job.notNaflex).then(() => null, (e) => `${e.name}: ${e.message}`);
const unchecked = await naflex.check().then(() => null, (e) => `${e.name}: ${e.message}`); // no manifest
console.log(JSON.stringify({ timing, patchSize: naflex.preprocess.patchSize, info: naflex.info, refused, unchecked }));
await naflex.release();
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[list[np.ndarray | Path], list[dict]]:
    """(what Python preprocesses, what Node is sent): the photographs as Pillow's decoded
    RGB (raw bytes for Node), the synthetic images as PNG files (both decode them)."""
    d = tmp_path_factory.mktemp("naflex-images")
    rng = np.random.default_rng(0)
    assert len(PHOTOS) == 12
    python, node = [], []
    for p in PHOTOS:
        rgb = np.asarray(load_image(p))  # (H, W, 3) uint8, upright
        (d / f"{p.stem}.rgb").write_bytes(rgb.tobytes())
        python.append(rgb)
        node.append({"rgb": str(d / f"{p.stem}.rgb"), "width": rgb.shape[1], "height": rgb.shape[0]})
    for h, w in [*SYNTHETIC, RGBA]:
        channels = 4 if (h, w) == RGBA else 3
        f = d / f"{h}x{w}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, channels), dtype=np.uint8)).save(f)
        python.append(f)
        node.append({"file": str(f)})
    return python, node


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny random Siglip2VisionModel (tests/export/test_naflex.py's) through export_naflex."""
    from siglip2_tiny import tiny_siglip2

    from vit_deploy.export.checkpoints import CheckpointWarning
    from vit_deploy.export.naflex.bundle import export_naflex

    _, directory = tiny_siglip2(tmp_path_factory.mktemp("hf") / "siglip2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        return export_naflex(directory, tmp_path_factory.mktemp("naflex") / "out").path


@pytest.fixture(scope="module")
def node_run(images, model, tmp_path_factory) -> tuple[Path, dict, list[dict]]:
    """Runs the driver once: (its output folder, what it printed, the ONNX cases)."""
    d = tmp_path_factory.mktemp("naflex-node")
    n_photos, n_all = len(PHOTOS), len(images[1])
    cases = [{"budget": 64, "picks": [0]},  # one photograph
             {"budget": 256, "picks": list(range(n_all))},  # everything, mixed aspect ratios
             {"budget": 1024, "picks": [1, n_photos + 3, n_photos + 9, n_photos + 2]}]
    job = {"images": images[1], "budgets": list(BUDGETS), "out": str(d), "model": str(model),
           "cases": cases, "jpegs": [str(p) for p in PHOTOS], "jpegBudget": 256}
    job["notNaflex"] = str(_identity_onnx(d / "identity.onnx"))
    (d / "job.json").write_text(json.dumps(job))
    (d / "driver.mjs").write_text(DRIVER)
    t0 = time.perf_counter()
    r = subprocess.run([_node(), str(d / "driver.mjs"), str(d / "job.json"),
                        (WEB / "src" / "node.mjs").as_uri()], cwd=WEB, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    printed = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"node driver: {time.perf_counter() - t0:.1f} s; preprocessing ms per budget "
          f"{ {k: round(v) for k, v in printed['timing'].items()} }")
    return d, printed, cases


def _identity_onnx(path: Path) -> Path:
    """An ONNX graph that is no NaFlex graph: one input, x -> Identity -> y."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _read(path: Path, dtype, shape) -> np.ndarray:
    return np.fromfile(path, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


@pytest.mark.parametrize("budget", BUDGETS)
def test_preprocessing_is_python_bit_for_bit(images, node_run, budget):
    d, _, _ = node_run
    want = NaFlexPreprocess(max_num_patches=budget)(images[0])
    B, N, D = want.pixel_values.shape
    got_values = _read(d / f"values_{budget}.f32", np.float32, (B, N, D))
    got_mask = _read(d / f"mask_{budget}.i32", np.int32, (B, N))
    got_shapes = _read(d / f"shapes_{budget}.i64", np.int64, (B, 2))
    np.testing.assert_array_equal(got_shapes, want.spatial_shapes)
    np.testing.assert_array_equal(got_mask, want.pixel_attention_mask)
    diff = float(np.abs(got_values - want.pixel_values).max())
    print(f"max_num_patches {budget}: {B} images, grids {want.spatial_shapes.tolist()}: "
          f"max abs difference {diff}")
    assert diff == 0.0


def test_jpeg_decoded_in_node_stays_near_pillow(node_run):
    """jpeg-js (Node's decoder here) upsamples chroma without libjpeg's "fancy" filter: a
    decoder difference of a few levels, not a preprocessing one (the test above starts from
    Pillow's pixels)."""
    d, _, _ = node_run
    want = NaFlexPreprocess(max_num_patches=256)(PHOTOS).pixel_values
    got = _read(d / "jpeg.f32", np.float32, want.shape)
    levels = float(np.abs(got - want).max()) * 255 / 2  # one level of 255 is 2/255 here
    print(f"jpeg-js vs Pillow (libjpeg-turbo) decoding, then NaFlex at 256: max {levels:.1f} "
          f"levels of 255, mean {float(np.abs(got - want).mean()) * 255 / 2:.3f}")
    assert 0 < levels <= JPEG_LEVELS


def test_onnx_features_match_python_onnxruntime(images, model, node_run):
    """naflexFeatures (onnxruntime-node) against NaFlexSession (onnxruntime): pooled and each
    image's tokens on its own grid, one image and mixed-aspect batches."""
    from vit_deploy.runtime.naflex.session import NaFlexSession

    d, printed, cases = node_run
    assert printed["patchSize"] == 16 and printed["info"]["provider"] == "cpu"
    assert printed["info"]["splitBatches"] is False  # a bare fp32 model.onnx: one run a batch
    assert printed["unchecked"].startswith("BundleError: ") and "has no NaFlex golden references " \
        "(a bare model.onnx: load its bundle)" in printed["unchecked"], printed["unchecked"]
    assert printed["refused"].startswith("BundleError: ") and "is not a NaFlex graph: expected " \
        "inputs [\"pixel_values\",\"pixel_attention_mask\",\"spatial_shapes\"]" in \
        printed["refused"] and 'got inputs ["x"], outputs ["y"]' in printed["refused"], printed
    worst = {}
    for i, case in enumerate(cases):
        want = NaFlexSession(model, max_num_patches=case["budget"]).features(
            [images[0][p] for p in case["picks"]])
        got = _read(d / f"pooled_{i}.f32", np.float32, want.pooled.shape)
        rel = float(np.abs(got - want.pooled).max() / np.abs(want.pooled).max())
        for j, tokens in enumerate(want.tokens):
            g = _read(d / f"tokens_{i}_{j}.f32", np.float32, tokens.shape)
            rel = max(rel, float(np.abs(g - tokens).max() / np.abs(tokens).max()))
        worst[f"{len(case['picks'])} image(s) at {case['budget']}"] = rel
    print("ONNX, Node vs Python (max abs / max abs):",
          {k: f"{v:.2e}" for k, v in worst.items()})
    assert max(worst.values()) <= RTOL, worst
