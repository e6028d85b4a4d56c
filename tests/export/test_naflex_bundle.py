"""A SigLIP 2 NaFlex bundle end to end: `export --naflex` writes manifest.json (NaFlex inputs,
the patch budget, golden references), model.onnx and the weights; NaFlexSession /
open_session run it (ViTSession refuses it by name); predict --features, info, check
(PyTorch and --reference bundle, six aspect ratios from 1:4 to 8:1 and a mixed batch) and
quantize int8 work on it; bad flag combinations are one-line errors, exit 2.

One random-weight tower (64 wide, 2 layers, patch 16, a 16x16 table) saved with
save_pretrained and exported once per module, with a budget of 64 patches."""

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import transformers as T
from local_paths import assert_names_no_local_path
from siglip2_tiny import tiny_siglip2
from vit_deploy.cli import main
from vit_deploy.runtime import NaFlexSession, ViTSession, load_manifest, open_session
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.naflex.contract import NAFLEX_INPUTS, NAFLEX_OUTPUTS
from vit_deploy.runtime.naflex.session import NaFlexInputError

pytestmark = pytest.mark.heavy  # one export (~20 s on 2 cores) and PyTorch checks
BUDGET = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_siglip2(tmp_path_factory.mktemp("hf") / "siglip2")[1]


@pytest.fixture(scope="module")
def bundle(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("naflex") / "b"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(checkpoint), "--naflex",
                                  "--max-patches", str(BUDGET), "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, hw + (3,), dtype=np.uint8)
            for hw in ((40, 160), (160, 40), (90, 60), (64, 64), (30, 200))]


def test_a_published_bundle_names_no_local_path(bundle, checkpoint):
    """The manifest says which checkpoint by its folder's name; the graph keeps none of the
    exporter's stack traces (absolute paths of this machine)."""
    assert load_manifest(bundle).export["source"]["checkpoint"] == checkpoint.name
    assert_names_no_local_path(bundle, checkpoint)


def test_the_manifest_says_naflex_and_round_trips(bundle):
    m = load_manifest(bundle)
    assert m.naflex and m.preprocess.resize == "naflex" and m.preprocess.layout == "patches"
    assert m.preprocess.max_num_patches == BUDGET
    assert [i.name for i in m.io.inputs] == list(NAFLEX_INPUTS)
    assert m.io.inputs[0].shape == ("batch", "num_patches", 3 * 16 * 16)
    assert m.io.output_names == list(NAFLEX_OUTPUTS)
    assert {"model.onnx", "weights.safetensors", "references.bin"} <= set(m.files)
    assert m.references is None and len(m.naflex_references.cases) == 3
    assert Manifest.from_json(m.to_json()) == m
    with pytest.raises(BundleError, match="NaFlex bundle"):
        m.require_nchw("vit-deploy target")
    data = json.loads(m.to_json())
    data["preprocess"]["resize"] = "squash"
    with pytest.raises(BundleError, match="NaFlex's"):
        Manifest.from_dict(data)


def test_sessions(bundle, images):
    with open_session(bundle) as s:
        assert isinstance(s, NaFlexSession) and s.preprocess.max_num_patches == BUDGET
        out = s.features(images)
    with NaFlexSession(bundle / "model.onnx", max_num_patches=BUDGET) as bare:
        np.testing.assert_array_equal(bare.features(images).pooled, out.pooled)
    assert out.pooled.shape == (5, 64)
    assert [t.shape[:2] for t in out.tokens][:2] == [(4, 16), (16, 4)]  # 1:4 and 4:1 grids
    for path in (bundle, bundle / "model.onnx"):
        with pytest.raises(BundleError, match="NaFlexSession"):
            ViTSession(path)


def test_predict_writes_pooled_and_token_grids(bundle, images, tmp_path):
    files = []
    for i, image in enumerate(images):
        files.append(tmp_path / f"{i}.png")
        Image.fromarray(image).save(files[-1])
    npz = tmp_path / "f.npz"
    r = CliRunner().invoke(main, ["predict", str(bundle), *map(str, files), "--features",
                                  str(npz), "--quiet"])
    assert r.exit_code == 0, r.output
    got = np.load(npz)
    with NaFlexSession(bundle) as s:
        want = s.features(images)
    np.testing.assert_allclose(got["pooled"], want.pooled, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["patch_tokens_1"], want.tokens[1].transpose(2, 0, 1),
                               rtol=1e-5, atol=1e-6)
    r = CliRunner().invoke(main, ["predict", str(bundle), str(files[0])])
    assert r.exit_code == 2 and "--features" in r.output


def test_info_and_check_both_references(bundle, tmp_path):
    r = CliRunner().invoke(main, ["info", str(bundle)])
    assert r.exit_code == 0 and f"at most {BUDGET} patches" in r.output
    for reference in ("pytorch", "bundle"):
        report = tmp_path / f"{reference}.json"
        r = CliRunner().invoke(main, ["check", str(bundle), "--reference", reference,
                                      "--json", str(report), "--quiet"])
        assert r.exit_code == 0, r.output
        cases = json.loads(report.read_text())["cases"]
        labels = " ".join(c["case"] for c in cases)
        assert "128x32" in labels and "32x128" in labels and "24x192" in labels  # 1:4 .. 8:1
        assert all(c["passed"] for c in cases) and len(cases) >= 6
        assert ("photos" in labels) == (reference == "pytorch")


def test_quantize_int8_then_check(bundle, tmp_path):
    copy = tmp_path / "q"
    shutil.copytree(bundle, copy)
    r = CliRunner().invoke(main, ["quantize", str(copy), "--precision", "int8", "--quiet"])
    assert r.exit_code == 0, r.output
    m = load_manifest(copy)
    assert "int8" in m.models
    photos = m.precisions["int8"]["real_images"]["cases"]
    assert photos and min(c["cosine_min"] for c in photos) >= 0.99
    r = CliRunner().invoke(main, ["check", str(copy), "--precision", "int8", "--reference",
                                  "bundle", "--quiet"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["quantize", str(copy), "--precision", "int8-static"])
    assert r.exit_code == 2 and "NaFlex" in r.output


@pytest.mark.parametrize("flags", [["--eval-set", "digits"], ["--max-drop", "0.01"],
                                   ["--smooth", "0.5"], ["--calib", "photos"],
                                   ["--eval", "photos", "--float-head"]], ids=str)
def test_quantize_flags_a_naflex_bundle_cannot_apply_are_refused(bundle, flags):
    """Not silently ignored (they were: accuracy '-', the photographs judged instead)."""
    before = sorted(p.name for p in bundle.iterdir())
    r = CliRunner().invoke(main, ["quantize", str(bundle), "--precision", "int8", *flags])
    assert r.exit_code == 2 and "not applied to a SigLIP 2 NaFlex bundle" in r.output
    assert " ".join(f for f in flags if f.startswith("--")) in r.output
    assert "Traceback" not in r.output and sorted(p.name for p in bundle.iterdir()) == before


@pytest.mark.parametrize("flags, message", [
    (["--res", "224"], "--res cannot apply"),
    (["--static", "--layers", "1"], "--static, --layers cannot apply"),
    # refused before writing (--smooth once was refused after the bundle was written)
    (["--precision", "int8", "--smooth", "0.5"], "--smooth: not applied to a SigLIP 2 NaFlex"),
    (["--precision", "fp16,int8-static"], "int8-static cannot apply"),
    (["--precision", "int4", "--calib", "photos"], "int4 cannot apply"),
])
def test_bad_combinations_are_one_line_errors(checkpoint, tmp_path, flags, message):
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(checkpoint), "--naflex",
                                  *flags, "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("budget", [16384, 65536])
def test_a_budget_memory_cannot_hold_is_refused_before_writing(checkpoint, tmp_path, budget,
                                                               monkeypatch):
    """`export --max-patches 65536` ran out of memory building its golden references; with
    1 GiB available (stood in), it is refused up front, naming the budget and its estimate."""
    from vit_deploy.runtime import sizes

    monkeypatch.setattr(sizes, "available_memory", lambda: 2**30)
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(checkpoint), "--naflex",
                                  "--max-patches", str(budget), "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert f"max_num_patches {budget} means {budget} tokens: attention needs about" in r.output
    assert "use a smaller --max-patches" in r.output and "allow_large" not in r.output
    assert not any(tmp_path.iterdir()), "nothing written"


def test_naflex_needs_a_siglip2_checkpoint(tmp_path):
    r = CliRunner().invoke(main, ["export", "--naflex", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "needs a SigLIP 2 --checkpoint" in r.output
    r = CliRunner().invoke(main, ["export", "--max-patches", "64"])
    assert r.exit_code == 2 and "needs --naflex" in r.output
    vit = tmp_path / "vit"
    T.ViTModel(T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, image_size=32, patch_size=16)
               ).save_pretrained(vit)
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(vit), "--naflex",
                                  "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "model_type 'vit'" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1



@pytest.mark.parametrize("argv", [
    ["target", "{b}", "--target", "cpu", "--buckets", "224"],
    ["triton", "{b}", "--out", "{tmp}/repo"],
    ["bench", "{b}"],
    ["serve", "{b}", "--port", "0"],
    ["embed", "{b}", "{image}", "--out", "{tmp}/f.parquet"],
], ids=lambda a: a[0])
def test_commands_for_nchw_bundles_refuse_in_one_line(bundle, tmp_path, argv):
    image = next(iter(sorted((Path(__file__).parents[2] / "vit_deploy" / "data" / "photos")
                             .glob("*.jpg"))))
    args = [a.format(b=bundle, tmp=tmp_path, image=image) for a in argv]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert "NaFlex" in r.output, r.output
    assert not any(tmp_path.iterdir()), "nothing written"


def _published(checkpoint: Path, where: Path, **processor) -> Path:
    """The tower with the preprocessor_config.json transformers' own save_pretrained writes
    for a SigLIP 2 NaFlex processor, the form google/siglip2-*-naflex carry on the hub:
    max_num_patches and patch_size, no size."""
    shutil.copytree(checkpoint, where)
    with warnings.catch_warnings():  # no torchvision here: transformers says it uses PIL
        warnings.simplefilter("ignore")
        T.Siglip2ImageProcessor(**processor).save_pretrained(where)
    written = json.loads((where / "preprocessor_config.json").read_text())
    assert "size" not in written and written["max_num_patches"] == processor.get(
        "max_num_patches", 256), written
    return where


def test_a_published_naflex_processor_is_read_budget_and_normalisation(checkpoint, tmp_path):
    """`export --naflex` on a checkpoint with its processor as published exports with the
    processor's patch budget and normalisation (it was refused: 'size must be ...')."""
    src = _published(checkpoint, tmp_path / "ckpt", max_num_patches=48,
                     image_mean=[0.25, 0.5, 0.75], image_std=[0.5, 0.25, 0.5])
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(src), "--naflex", "--out",
                                  str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    m = load_manifest(out)
    assert m.export["max_num_patches"] == 48
    assert list(m.preprocess.mean) == [0.25, 0.5, 0.75] and list(m.preprocess.std) == [0.5, 0.25, 0.5]
    assert m.export["source"]["preprocess_from"].endswith("preprocessor_config.json")


def test_a_processor_of_another_patch_size_is_refused(checkpoint, tmp_path):
    src = _published(checkpoint, tmp_path / "ckpt", patch_size=14)
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(src), "--naflex", "--out",
                                  str(tmp_path / "b")])
    assert r.exit_code == 2 and "patch_size 14" in r.output and "16" in r.output, r.output
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("place", ["shifted", "gap", "padding set", "a 2"])
def test_a_mask_that_is_not_the_grid_then_padding_is_refused(bundle, images, place):
    """The model reads patch i as grid cell i: a mask with the right count of real patches
    in other places was run (pooled off by 3.6); now a NaFlexInputError naming the image."""
    with NaFlexSession(bundle / "model.onnx", max_num_patches=BUDGET) as s:
        batch = s.preprocess(images)
        values, mask, shapes = (a.copy() for a in batch)
        cells = shapes.prod(axis=1)
        i = int(np.flatnonzero(cells < BUDGET)[0])  # an image with padding
        row, n = mask[i], int(cells[i])
        if place == "shifted":
            row[:] = 0
            row[1:n + 1] = 1
        elif place == "gap":
            row[n - 1], row[n] = 0, 1
        elif place == "padding set":
            row[0], row[-1] = 0, 1
        else:
            row[0], row[1] = 2, 0
        assert row.sum() == n  # the count of real patches is right: only their places differ
        with pytest.raises(NaFlexInputError, match=rf"image {i} is not"):
            s.run(type(batch)(values, mask, shapes))
        assert s.run(batch)["pooled"].shape[0] == len(images)  # the batch as built runs


@pytest.mark.parametrize("shape", [[6, 2**62, 2**62], [6, 2**32, 2**32, 16]])
def test_a_reference_shape_that_overflows_is_a_manifest_error(bundle, tmp_path, shape):
    """A hand-edited output shape whose size wraps int64 passed the bounds check and failed
    later with a traceback; both runtimes now read it as too large for references.bin."""
    edited = tmp_path / "b"
    shutil.copytree(bundle, edited)
    m = json.loads((edited / "manifest.json").read_text())
    m["naflex_references"]["cases"][0]["outputs"]["pooled"]["shape"] = shape
    (edited / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=r"naflex_references\.cases\[0\]\.outputs\['pooled'\] "
                                          r"must be batch 6 first, inside the \d+-byte "
                                          r"references\.bin"):
        load_manifest(edited)
    r = CliRunner().invoke(main, ["check", str(edited), "--reference", "bundle"])
    assert r.exit_code == 2 and "Traceback" not in r.output and "references.bin" in r.output, \
        r.output


@pytest.mark.parametrize("provider", ["openvino", "openvino:gpu", "cpu,openvino"])
def test_openvino_is_refused_naming_what_runs_naflex(bundle, tmp_path, provider):
    """OpenVINO (the openvino package) runs NCHW bundles only; a NaFlex bundle asked to run on
    it said 'this onnxruntime build lists only [...]' (ONNX Runtime was asked instead)."""
    image = tmp_path / "x.png"
    Image.new("RGB", (64, 40), "gray").save(image)
    r = CliRunner().invoke(main, ["predict", str(bundle), str(image), "--features",
                                  str(tmp_path / "f.npz"), "--provider", provider])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "NaFlexSession runs through ONNX Runtime only" in r.output and "openvino-ep" in r.output
    assert not (tmp_path / "f.npz").exists()


@pytest.mark.parametrize("budget", [0, -3, True, 2.5, 65_537])
def test_a_budget_that_is_not_a_patch_count_is_refused(bundle, budget):
    """max_num_patches=0 was read as 'not given' (the bundle's 64 ran)."""
    with pytest.raises(ValueError, match=rf"max_num_patches must be an integer from 1 .*{budget}"):
        NaFlexSession(bundle, max_num_patches=budget)


@pytest.mark.parametrize("batches", ["4", "1,8", "2"])
def test_check_refuses_a_batch_it_cannot_apply(bundle, batches):
    r = CliRunner().invoke(main, ["check", str(bundle), "--batch", batches])
    assert r.exit_code == 2 and f"--batch {batches} cannot apply" in r.output, r.output


@pytest.mark.parametrize("flags, named", [(["--top-k", "3"], "--top-k 3"),
                                          (["--target", "cpu"], "--target cpu"),
                                          (["--res", "64"], "resolution")])
def test_predict_refuses_what_a_naflex_bundle_cannot_apply(bundle, tmp_path, flags, named):
    """--top-k and --target were silently ignored on a NaFlex bundle."""
    image = tmp_path / "x.png"
    Image.new("RGB", (64, 40), "gray").save(image)
    out = tmp_path / "f.npz"
    r = CliRunner().invoke(main, ["predict", str(bundle), str(image), "--features", str(out),
                                  *flags])
    assert r.exit_code == 2 and named in r.output and "cannot apply" in r.output, r.output
    assert not out.exists()


@pytest.mark.parametrize("call, expected", [
    (lambda b: NaFlexSession(5), r"NaFlexSession\(model\) must be .* got int 5"),
    (lambda b: NaFlexSession(b, precision=3), r"precision must be .* got int 3"),
    (lambda b: NaFlexSession(b, options=1), r"options must be a RuntimeOptions"),
    (lambda b: NaFlexSession(b).features(5), r"images must be .* got int 5"),
    (lambda b: NaFlexSession(b).features(None), r"images must be .* got NoneType"),
    (lambda b: NaFlexSession(b).run((1, 2, 3)), r"batch must be a NaFlexBatch")])
def test_wrong_argument_types_are_named(bundle, call, expected):
    """As ViTSession's: which argument, what it takes, what was given (they were internal
    TypeErrors and AttributeErrors)."""
    with pytest.raises(TypeError, match=expected):
        call(bundle)


def test_a_closed_session_says_so(bundle, images):
    s = NaFlexSession(bundle)
    assert s.features(images[0]).pooled.shape == (1, 64)  # one image, as ViTSession takes it
    s.close()
    for use in (lambda: s.features(images), lambda: s.run(None)):
        with pytest.raises(RuntimeError, match="this NaFlexSession is closed"):
            use()


def test_open_session_takes_the_same_arguments_for_either_input_kind(bundle, tmp_path):
    """check opens every bundle through open_session with ViTSession's arguments (target
    too): a NaFlex bundle takes target 'auto' or 'none' and gives the same outputs, and a
    bucket target it cannot have is named, not ignored."""
    photo = np.asarray(Image.new("RGB", (48, 20), (200, 40, 90)))
    with open_session(bundle, target="none", precision="fp32") as s:
        assert isinstance(s, NaFlexSession) and s.engine.startswith("onnxruntime ")
        out = s.outputs([photo])
        prepared = s.outputs(s.preprocess([photo]))  # a NaFlexBatch made once, as quantize does
    with open_session(bundle) as s:
        again = s.outputs([photo])
    assert set(out) == set(NAFLEX_OUTPUTS)
    assert all(np.array_equal(out[n], again[n]) and np.array_equal(out[n], prepared[n])
               for n in NAFLEX_OUTPUTS)
    batch = s.preprocess([photo])
    padding = batch.pixel_attention_mask[0] == 0
    assert padding.any() and not out[NAFLEX_OUTPUTS[1]][0][padding].any()  # zeroed
    with pytest.raises(NaFlexInputError, match="target 'mobile': a NaFlex bundle has no bucket"):
        open_session(bundle, target="mobile")
    with open_session(bundle) as s:  # outputs checks its argument at the door, as features
        with pytest.raises(TypeError, match="images must be an image .* got int"):
            s.outputs(3)
    with pytest.raises(RuntimeError, match="closed"):
        s.outputs([photo])
