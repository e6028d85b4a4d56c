"""SigLIP 2 NaFlex end to end: the reference model on transformers' native-aspect inputs
(PyTorch and the exported ONNX graph in ONNX Runtime) reproduces Siglip2VisionModel, pooled
and last hidden state at the real positions, for aspect ratios 1:4 to 4:1, alone and in
mixed batches; padding changes nothing.

A random-weight tower (64 wide, 2 layers, 4 heads, patch 16, a 16x16 table) saved with
save_pretrained and loaded back by our siglip2 family; its inputs made by
Siglip2ImageProcessorPil from random images of each aspect ratio."""

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import transformers as T
from siglip2_tiny import tiny_siglip2
from vit_deploy.export.checkpoints import CheckpointWarning, load_any
from vit_deploy.export.naflex.model import NaFlexViT, naflex_pos_weights
from vit_deploy.export.naflex.bundle import PARITY_CASES, export_naflex
from vit_deploy.runtime.config import variant
from vit_deploy.export.model import build_model
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.naflex.contract import METADATA_NAFLEX_KEY, NAFLEX_INPUTS, NAFLEX_OUTPUTS
from vit_deploy.runtime.naflex.session import NaFlexInputError, NaFlexSession

RTOL = 1e-4  # max abs error / max abs reference, per output and case
RATIOS = np.exp(np.linspace(np.log(1 / 4), np.log(4), 21))  # 1:4 ... 4:1 (height:width)
BUDGETS = (64, 256)  # max_num_patches for the single-image cases
MIXED = [(64, (0, 10, 20)), (128, (1, 5, 12, 19)), (256, tuple(range(0, 21, 3)))]


@pytest.fixture(scope="module")
def tower(tmp_path_factory):
    """(transformers model, our NaFlexViT, our ViT), the same random weights."""
    hf, directory = tiny_siglip2(tmp_path_factory.mktemp("hf") / "siglip2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        ours, fmt = load_any(directory)
    assert fmt == "hf" and ours.cfg.pos_interp == "bilinear" and ours.cfg.pos_antialias
    return hf, NaFlexViT(ours).eval(), ours, directory


@pytest.fixture(scope="module")
def images():
    """Random RGB images of each aspect ratio in RATIOS, about 200x200 pixels' worth."""
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (int(200 / r ** 0.5), int(200 * r ** 0.5), 3),
                                         dtype=np.uint8)) for r in 1 / RATIOS]


def cases(images):
    """(label, processor output) for every single image at each budget, then the mixed
    batches (each several aspect ratios)."""
    for i, image in enumerate(images):
        for n in BUDGETS:
            yield f"{image.size} n={n}", processed([image], n)
    for n, picks in MIXED:
        yield f"mixed {picks} n={n}", processed([images[i] for i in picks], n)


def processed(images, n: int) -> dict[str, torch.Tensor]:
    return dict(T.Siglip2ImageProcessorPil(max_num_patches=n)(images=images, return_tensors="pt"))


def reference(hf, inputs) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        out = hf(**inputs)
    return out.pooler_output.numpy(), out.last_hidden_state.numpy()


def errors(got, want, mask) -> list[tuple[float, float]]:
    """[(max abs, max abs / max |reference|)] for pooled, and last_hidden_state where real."""
    real = mask.astype(bool)
    out = []
    for g, w in ((got[0], want[0]), (got[1][real], want[1][real])):
        e = float(np.abs(g - w).max())
        out.append((e, e / float(np.abs(w).max())))
    return out


def check_all(run, hf, images) -> list[tuple[float, float]]:
    """Every case through `run` (inputs -> (pooled, last)); all failures reported at once;
    the worst (abs, rel) per output returned."""
    worst, failures, count = [(0.0, 0.0)] * 2, [], 0
    for label, inputs in cases(images):
        errs = errors(run(inputs), reference(hf, inputs), inputs["pixel_attention_mask"].numpy())
        worst = [(max(a, e), max(r, q)) for (a, r), (e, q) in zip(worst, errs)]
        failures += [f"{label} {name}: abs {e:.2e} rel {q:.2e}"
                     for name, (e, q) in zip(NAFLEX_OUTPUTS, errs) if q > RTOL]
        count += 1
    assert count == len(RATIOS) * len(BUDGETS) + len(MIXED)
    assert not failures, "\n".join(failures)
    return worst


def torch_run(model):
    def run(inputs):
        with torch.no_grad():
            pooled, last = model(*(inputs[k] for k in NAFLEX_INPUTS))
        return pooled.numpy(), last.numpy()
    return run


def test_position_weights_are_transformers_resize(tower):
    """The pure function alone: the table resized per image equals transformers' own
    resize_positional_embeddings, and F.interpolate(bilinear, antialias) of each image's
    grid (up and down, both axes, padding rows)."""
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

    table = torch.randn(16, 16, 8)
    shapes = torch.tensor([[1, 1], [2, 40], [40, 2], [16, 16], [7, 23], [32, 8], [5, 5]])
    n = 64 * 5
    ours = naflex_pos_weights((16, 16), shapes, n) @ table.reshape(256, 8)  # (B, n, 8)
    theirs = Siglip2VisionEmbeddings.resize_positional_embeddings(table, shapes, n)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    for b, (h, w) in enumerate(shapes.tolist()):
        direct = F.interpolate(table.permute(2, 0, 1)[None], size=(h, w), mode="bilinear",
                               align_corners=False, antialias=True)[0]  # (8, h, w)
        torch.testing.assert_close(ours[b, :h * w], direct.flatten(1).T, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours[b, h * w:], ours[b, :1].expand(n - h * w, -1))
    plain = naflex_pos_weights((16, 16), shapes, n, antialias=False) @ table.reshape(256, 8)
    for b, (h, w) in enumerate(shapes.tolist()):  # without antialias: plain bilinear
        direct = F.interpolate(table.permute(2, 0, 1)[None], size=(h, w), mode="bilinear",
                               align_corners=False)[0]  # (8, h, w)
        torch.testing.assert_close(plain[b, :h * w], direct.flatten(1).T, rtol=0, atol=1e-5)


def test_torch_matches_transformers_at_every_aspect_ratio(tower, images):
    hf, model = tower[:2]
    worst = check_all(torch_run(model), hf, images)
    print(f"torch vs transformers, worst (abs, rel): pooled {worst[0]}, last {worst[1]}")


def test_padding_changes_nothing(tower, images):
    """Garbage in the padded patches, more padding, and a batch of mixed aspect ratios:
    the real positions come out the same as each image alone."""
    hf, model = tower[:2]
    run = torch_run(model)
    picks = [images[0], images[10], images[20]]
    batch = processed(picks, 128)
    pooled, last = run(batch)
    mask = batch["pixel_attention_mask"].bool()
    noisy = dict(batch, pixel_values=torch.where(mask[..., None], batch["pixel_values"],
                                                 torch.randn_like(batch["pixel_values"]) * 9))
    more = {k: batch[k] for k in NAFLEX_INPUTS}
    more["pixel_values"] = F.pad(batch["pixel_values"], (0, 0, 0, 50))
    more["pixel_attention_mask"] = F.pad(batch["pixel_attention_mask"], (0, 50))
    for other in (noisy, more):
        p, h = run(other)
        np.testing.assert_allclose(p, pooled, rtol=0, atol=1e-5)
        np.testing.assert_allclose(h[:, :128][mask.numpy()], last[mask.numpy()], rtol=0, atol=1e-5)
    for i, image in enumerate(picks):
        p, h = run(processed([image], 128))
        np.testing.assert_allclose(p[0], pooled[i], rtol=0, atol=1e-5)
        real = mask[i].numpy()
        np.testing.assert_allclose(h[0][real], last[i][real], rtol=0, atol=1e-5)
    # and the mask is what makes it so: without it the padding leaks into every output
    unmasked = dict(noisy, pixel_attention_mask=torch.ones_like(batch["pixel_attention_mask"]))
    assert np.abs(run(unmasked)[0] - pooled).max() > 1e-3


def test_naflex_refuses_models_it_cannot_run():
    with pytest.raises(ValueError, match="expected .*no prefix tokens .*got 1"):
        NaFlexViT(build_model(variant("tiny", pool="map")))
    cfg = variant("tiny", pool="map", class_token=False, pos_interp="bicubic")
    with pytest.raises(ValueError, match=r"pos_interp 'bilinear' \(got 'bicubic'\)"):
        NaFlexViT(build_model(cfg))


@pytest.fixture(scope="module")
def onnx_path(tower, tmp_path_factory):
    """The checkpoint folder exported (export_naflex: the graph, judged against PyTorch)."""
    done = export_naflex(tower[3], tmp_path_factory.mktemp("naflex"))
    assert done.report and len(done.report.cases) == 2 * len(PARITY_CASES)
    assert max(c.max_rel for c in done.report.cases) < RTOL, str(done)
    assert [p.name for p in done.path.parent.iterdir()] == ["model.onnx"]  # nothing staged left
    return done.path


@pytest.mark.heavy  # the export: ~12 s of the file's ~20
def test_onnx_matches_transformers_at_every_aspect_ratio(tower, images, onnx_path):
    """One graph: dynamic batch and number of patches, dims named, NaFlex in its metadata;
    ONNX Runtime reproduces transformers on every case."""
    proto = onnx.load(str(onnx_path), load_external_data=False)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*proto.graph.input, *proto.graph.output]}
    assert dims == {"pixel_values": ["batch", "num_patches", 768],
                    "pixel_attention_mask": ["batch", "num_patches"],
                    "spatial_shapes": ["batch", 2], "pooled": ["batch", 64],
                    "last_hidden_state": ["batch", "num_patches", 64]}
    assert METADATA_NAFLEX_KEY in {p.key for p in proto.metadata_props}
    assert not {n.op_type for n in proto.graph.node} & {"Loop", "Resize"}  # plain arithmetic
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])

    def run(inputs):
        return session.run(None, {k: inputs[k].numpy() for k in NAFLEX_INPUTS})
    worst = check_all(run, tower[0], images)
    print(f"ONNX Runtime vs transformers, worst (abs, rel): pooled {worst[0]}, last {worst[1]}")


@pytest.mark.heavy  # the export: ~12 s of the file's ~20
def test_session_runs_images_torch_free(tower, onnx_path, tmp_path):
    """NaFlexSession: images of two aspect ratios in one batch, preprocessed without torch,
    through the graph; pooled and each image's tokens on its own grid match transformers
    on the processor's inputs for the same images. Bad inputs and foreign graphs refused."""
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((30, 300), (90, 60))]
    session = NaFlexSession(onnx_path.parent, max_num_patches=96)  # the folder
    got = session.features(arrays)
    inputs = processed([Image.fromarray(a) for a in arrays], 96)
    pooled, last = reference(tower[0], inputs)
    assert errors((got.pooled, last), (pooled, last), np.ones((2, 96)))[0][1] <= RTOL
    for tokens, want, (gh, gw) in zip(got.tokens, last, inputs["spatial_shapes"].tolist()):
        assert tokens.shape == (gh, gw, 64)
        e = np.abs(tokens.reshape(gh * gw, -1) - want[:gh * gw]).max()
        assert e <= RTOL * np.abs(want[:gh * gw]).max(), e
    batch = session.preprocess(arrays)
    wide = batch.pixel_attention_mask.astype(np.int64)
    with pytest.raises(NaFlexInputError, match=r"pixel_attention_mask: expected .*int32 .*int64"):
        session.run(batch._replace(pixel_attention_mask=wide))
    with pytest.raises(NaFlexInputError, match=r"grids \[\[2, 50\], \[12, 8\]\]"):
        session.run(batch._replace(spatial_shapes=np.array([[2, 50], [12, 8]])))
    plain = tmp_path / "plain.onnx"
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
        opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9), str(plain))
    with pytest.raises(BundleError, match="is not a NaFlex graph: expected inputs"):
        NaFlexSession(plain)
