"""Issue 24, the runtime trusts nothing it reads: a bundle whose manifest lies (or whose
files were swapped) is refused with a BundleError before it is used, whatever `verify` says.

1. Paths: every file the manifest names goes through `bundle_path`: no absolute names, no
   `..`, no symlink resolving outside the bundle (model, bucket graphs, weights).
2. Claims against the model: labels against the real output width, the batch kept by
   every output, the patch size against the model file's own metadata, NaN/Inf outputs.
3. Numbers that become arithmetic (mean, std, scale, sizes) within stated bounds.
4. Size guards before allocation.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from PIL import Image

from vit_deploy.cli import main
from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import MANIFEST_NAME, MODEL_FILE, WEIGHTS_FILE
from vit_deploy.runtime import BundleError, InputError, Preprocess, RuntimeOptions, ViTSession
from vit_deploy.runtime.manifest import Manifest, bundle_path, load_manifest
from vit_deploy.runtime.manifest_parts import FileEntry
from vit_deploy.runtime.results import OutputError

NO_VERIFY = RuntimeOptions(verify=False)
BUCKET = "targets/cpu/fp32-32x32.onnx"


@pytest.fixture(scope="module")
def source(tmp_path_factory, make_tiny) -> Path:
    """The tiny classifier (10 classes, patch 8, deploy 32x32); copies are edited."""
    from vit_deploy.export.bundle import ExportOptions, export_bundle

    out = tmp_path_factory.mktemp("untrusted") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(simplify=False))
    return out


def _copy(source: Path, tmp_path: Path, name: str = "b") -> Path:
    b = tmp_path / name
    shutil.copytree(source, b)
    return b


def _edit(b: Path, change) -> None:
    m = json.loads((b / MANIFEST_NAME).read_text())
    change(m)
    (b / MANIFEST_NAME).write_text(json.dumps(m))


def _rehash(b: Path) -> None:
    """Make the manifest's hashes match the files again (a consistent lie, not a damaged file)."""
    def change(m):
        for name, entry in m["files"].items():
            entry.update(asdict(FileEntry.of(b / name, entry.get("role", ""))))
    _edit(b, change)


def _with_bucket(b: Path) -> None:
    """A cpu target with one 32x32 bucket graph (a copy of the dynamic graph runs there)."""
    (b / BUCKET).parent.mkdir(parents=True)
    shutil.copy(b / MODEL_FILE, b / BUCKET)

    def change(m):
        m["files"][BUCKET] = asdict(FileEntry.of(b / BUCKET, "target:cpu:fp32"))
        m["targets"] = {"cpu": {"batch": 1, "policy": "aspect-then-area", "record": {},
                                "required_operators": None,
                                "graphs": [{"resolution": [32, 32], "batch": 1,
                                            "precision": "fp32", "file": BUCKET,
                                            "ort_file": None}]}}
    _edit(b, change)


def _image(tmp_path: Path, name: str = "cat.png", size=(40, 50)) -> Path:
    path = tmp_path / name
    Image.fromarray(np.full((*size, 3), 128, np.uint8)).save(path)
    return path


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _assert_refused(r, *words):
    text = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    for word in words:
        assert word in text, (word, r.output)


# -- 1. paths ------------------------------------------------------------------------------
def _outside_links(tmp_path: Path, b: Path, name: str) -> dict:
    """Ways for bundle file `name` to lead outside the bundle, each made by a function."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    shutil.copy(b / MODEL_FILE, outside / "real.onnx")  # a valid model: it would load
    path = b / name

    def absolute_to_system_file():
        path.symlink_to("/etc/passwd")

    def absolute_to_a_valid_model():
        path.symlink_to(outside / "real.onnx")

    def relative_up_and_out():
        path.symlink_to(os.path.relpath(outside / "real.onnx", path.parent))

    def chain_of_links():
        (b / "hop").symlink_to(outside / "real.onnx")
        path.symlink_to(b / "hop")  # inside, then out

    def directory_link():  # the file's own folder is a link leaving the bundle
        (outside / "dir").mkdir(exist_ok=True)
        shutil.copy(outside / "real.onnx", outside / "dir" / path.name)
        shutil.rmtree(path.parent) if path.parent != b else None
        path.parent.symlink_to(outside / "dir", target_is_directory=True)

    return {f.__name__: f for f in (absolute_to_system_file, absolute_to_a_valid_model,
                                    relative_up_and_out, chain_of_links, directory_link)}


LINKS = ["absolute_to_system_file", "absolute_to_a_valid_model", "relative_up_and_out",
         "chain_of_links"]


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("link", LINKS)
def test_a_model_file_linking_outside_is_refused(source, tmp_path, link, verify):
    b = _copy(source, tmp_path)
    make = _outside_links(tmp_path, b, MODEL_FILE)[link]
    (b / MODEL_FILE).unlink()
    make()
    with pytest.raises(BundleError, match="outside the bundle"):
        ViTSession(b, options=RuntimeOptions(verify=verify))


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("link", [*LINKS, "directory_link"])
def test_a_bucket_graph_linking_outside_is_refused(source, tmp_path, link, verify):
    b = _copy(source, tmp_path)
    _with_bucket(b)
    with ViTSession(b, options=NO_VERIFY, target="cpu") as s:  # the honest bucket runs
        assert s.buckets is not None and s.buckets.covers((32, 32))
        assert s.run(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, 10)
    make = _outside_links(tmp_path, b, BUCKET)[link]
    (b / BUCKET).unlink()
    make()
    with pytest.raises(BundleError, match="outside the bundle"):
        with ViTSession(b, options=RuntimeOptions(verify=verify), target="cpu") as s:
            s.run(np.zeros((1, 3, 32, 32), np.float32))  # the bucket's session opens here


@pytest.mark.parametrize("link", LINKS)
def test_the_weights_file_is_resolved_by_the_same_rule(source, tmp_path, link):
    b = _copy(source, tmp_path)
    make = _outside_links(tmp_path, b, WEIGHTS_FILE)[link]
    (b / WEIGHTS_FILE).unlink()
    make()
    m = load_manifest(b, verify=False)
    with pytest.raises(BundleError, match="outside the bundle"):
        m.resolve(b, m.weights_file)


@pytest.mark.parametrize("name", ["/etc/passwd", "../model.onnx", "a/../../model.onnx",
                                  "..", "a\\..\\b", "", "x\0y", "//etc/passwd",
                                  MANIFEST_NAME])
def test_bundle_path_refuses_names_that_are_not_relative_paths_inside(source, name):
    with pytest.raises(BundleError, match="relative path inside the bundle"):
        bundle_path(source, name)


def test_bundle_path_follows_links_that_stay_inside(source, tmp_path):
    b = _copy(source, tmp_path)
    (b / "sub").mkdir()
    (b / "sub" / "alias.onnx").symlink_to(b / MODEL_FILE)
    assert bundle_path(b, "sub/alias.onnx") == (b / MODEL_FILE).resolve()
    m = load_manifest(b)
    with pytest.raises(BundleError, match="not a file of this bundle"):
        m.resolve(b, "sub/alias.onnx")  # a real path inside, but not one the manifest lists


# -- 2. the manifest's claims against the model ---------------------------------------------
@pytest.mark.parametrize("labels", [1, 5, 9, 11])
def test_labels_are_checked_against_the_graphs_output_width(source, tmp_path, labels):
    """The manifest's config and io say `labels` classes; the graph has 10."""
    b = _copy(source, tmp_path)

    def change(m):
        m["config"]["num_classes"] = labels
        m["io"]["outputs"][0]["shape"] = ["batch", labels]
        m["labels"] = [f"c{i}" for i in range(labels)]
    _edit(b, change)
    for verify in (False, True):
        with pytest.raises(BundleError, match=f"{labels} labels, but the model's output "
                                              f"'logits' .* has 10 classes"):
            ViTSession(b, options=RuntimeOptions(verify=verify))
    r = _cli("predict", b, _image(tmp_path))
    _assert_refused(r, f"{labels} labels", "10 classes")


def _rewrite_model(b: Path, edit) -> None:
    """Edit model.onnx's graph with `edit(model)` and re-hash it in the manifest."""
    model = onnx.load(str(b / MODEL_FILE))
    edit(model)
    onnx.save(model, str(b / MODEL_FILE))
    _rehash(b)


def _symbolic_width(model):
    """The logits through Reshape(x, Shape(x)): the same numbers, a width ORT cannot know."""
    out = model.graph.output[0]
    for node in model.graph.node:
        node.output[:] = ["raw_logits" if o == out.name else o for o in node.output]
    model.graph.node.extend([helper.make_node("Shape", ["raw_logits"], ["raw_shape"]),
                             helper.make_node("Reshape", ["raw_logits", "raw_shape"],
                                              [out.name])])
    for dim, name in zip(out.type.tensor_type.shape.dim, ("batch", "classes")):
        dim.dim_param = name


@pytest.mark.parametrize("labels", [5, 11])
def test_labels_are_checked_at_the_first_run_when_the_graph_leaves_the_width_open(
        source, tmp_path, labels):
    b = _copy(source, tmp_path)
    _rewrite_model(b, _symbolic_width)

    def change(m):
        m["config"]["num_classes"] = labels
        m["labels"] = [f"c{i}" for i in range(labels)]
    _edit(b, change)
    with ViTSession(b) as s:  # nothing to compare yet
        assert s._session.get_outputs()[0].shape == ["batch", "classes"]
        with pytest.raises(BundleError, match=f"{labels} labels, .* 10 classes"):
            s.predict(np.full((32, 32, 3), 9, np.uint8))
    _assert_refused(_cli("predict", b, _image(tmp_path)), f"{labels} labels", "10 classes")


def _collapse_batch(op: str):
    """The logits of a graph that reduces the batch away: (B, 10) -> (1, 10)."""
    def edit(model):
        out = model.graph.output[0]
        for node in model.graph.node:
            node.output[:] = ["raw_logits" if o == out.name else o for o in node.output]
        if op == "ReduceMean":
            model.graph.initializer.append(helper.make_tensor("axes0", TensorProto.INT64, [1], [0]))
            model.graph.node.append(helper.make_node("ReduceMean", ["raw_logits", "axes0"],
                                                     [out.name], keepdims=1))
        else:  # the first row only
            for name, v in (("s0", 0), ("e1", 1), ("ax", 0)):
                model.graph.initializer.append(
                    helper.make_tensor(name, TensorProto.INT64, [1], [v]))
            model.graph.node.append(helper.make_node("Slice", ["raw_logits", "s0", "e1", "ax"],
                                                     [out.name]))
        out.type.tensor_type.shape.dim[0].dim_param = "rows"
    return edit


@pytest.mark.parametrize("op", ["ReduceMean", "Slice"])
@pytest.mark.parametrize("batch", [2, 3])
def test_a_graph_that_does_not_keep_the_batch_is_an_error(source, tmp_path, op, batch):
    b = _copy(source, tmp_path)
    _rewrite_model(b, _collapse_batch(op))
    with ViTSession(b) as s:
        assert s.run(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, 10)  # batch 1 fits
        with pytest.raises(BundleError, match=f"shape \\[1, 10\\] for a batch of {batch} "
                                              f"image.*does not keep the batch"):
            s.run(np.zeros((batch, 3, 32, 32), np.float32))
        with pytest.raises(BundleError, match="does not keep the batch"):
            s.predict([np.full((32, 32, 3), 9, np.uint8)] * batch)
    images = [_image(tmp_path, f"{i}.png") for i in range(batch)]
    r = _cli("predict", b, *images)
    _assert_refused(r, "does not keep the batch")
    assert "None" not in r.output


@pytest.mark.parametrize("claimed", [16, 32])
def test_the_patch_size_is_checked_against_the_models_own_metadata(source, tmp_path, claimed):
    b = _copy(source, tmp_path)

    def change(m):
        m["config"].update(patch_size=claimed, img_size=[claimed * 2, claimed * 2])
        m["io"]["patch_size"] = claimed
        m["preprocess"]["resolution"] = [claimed * 2, claimed * 2]
    _edit(b, change)
    assert load_manifest(b).io.patch_size == claimed  # consistent in itself
    for verify in (False, True):
        with pytest.raises(BundleError, match=f"manifest says patch size {claimed}, but .* "
                                              f"exported with patch size 8"):
            ViTSession(b, options=RuntimeOptions(verify=verify))
    _assert_refused(_cli("predict", b, _image(tmp_path)), f"patch size {claimed}")


def test_input_channels_are_checked_against_the_models_own_metadata(source, tmp_path):
    b = _copy(source, tmp_path)

    def change(m):
        m["config"].update(in_chans=1, mean=[0.5], std=[0.5])
        m["io"]["inputs"][0]["shape"][1] = 1
        m["preprocess"].update(mean=[0.5], std=[0.5])
    _edit(b, change)
    with pytest.raises(BundleError, match="input channels 1, but .* input channels 3"):
        ViTSession(b)


def _poison(value: float):
    """Multiply the logits by `value` in the graph (NaN, ±Inf)."""
    def edit(model):
        out = model.graph.output[0]
        for node in model.graph.node:
            node.output[:] = ["raw_logits" if o == out.name else o for o in node.output]
        model.graph.initializer.append(helper.make_tensor("poison", TensorProto.FLOAT, [1],
                                                          [value]))
        model.graph.node.append(helper.make_node("Mul", ["raw_logits", "poison"], [out.name]))
    return edit


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_nan_or_inf_output_is_an_error_not_a_result(source, tmp_path, value):
    b = _copy(source, tmp_path)
    _rewrite_model(b, _poison(value))
    with ViTSession(b) as s:
        assert not np.isfinite(s.run(np.zeros((1, 3, 32, 32), np.float32))).all()  # raw: as is
        with pytest.raises(OutputError, match="'logits' holds 10 NaN/Inf value"):
            s.predict(np.full((32, 32, 3), 9, np.uint8))
    for args in ([], ["--json"]):
        r = _cli("predict", b, _image(tmp_path), *args)
        _assert_refused(r, "NaN/Inf")
        assert "nan" not in r.output.replace("NaN", "")


# -- 3. numbers that become arithmetic -------------------------------------------------------
ABSURD = [("mean", [1e300, 0, 0]), ("mean", [-1e300, 0, 0]), ("mean", [0, 0, 1e5]),
          ("std", [1e300, 1, 1]), ("std", [1, 1, 1e5]), ("std", [1e-7, 1, 1]),
          ("std", [0, 1, 1]), ("std", [-0.5, 1, 1]), ("std", [5e-324, 1, 1]),
          ("scale", 1e300), ("scale", 1e-300), ("scale", 0), ("scale", -1 / 255),
          ("scale", 1e4), ("scale", None), ("mean", [0.5, 0.5]), ("std", "0.5")]


@pytest.mark.parametrize("key,value", ABSURD)
def test_absurd_preprocessing_numbers_in_a_manifest_are_refused(source, key, value):
    m = json.loads((source / MANIFEST_NAME).read_text())
    m["preprocess"][key] = value
    with pytest.raises(BundleError, match=f"preprocess.{key} must be"):
        Manifest.from_dict(m)


@pytest.mark.parametrize("key,value", [("mean", [1e4, -1e4, 0]), ("std", [1e-6, 1e4, 1]),
                                       ("scale", 1e3), ("scale", 1e-6), ("scale", 1)])
def test_the_bounds_themselves_are_accepted(source, key, value):
    m = json.loads((source / MANIFEST_NAME).read_text())
    m["preprocess"][key] = value
    assert Manifest.from_dict(m).preprocess  # loads


@pytest.mark.parametrize("key,value", [kv for kv in ABSURD if kv[1] is not None]
                         + [("mean", [float("nan")] * 3), ("std", [float("inf")] * 3)])
def test_absurd_numbers_are_refused_by_preprocess_itself(key, value):
    fields = dict(resolution=(32, 32), patch_size=8, mean=(0.5,) * 3, std=(0.5,) * 3)
    fields[key] = value
    with pytest.raises(ValueError, match=f"{key}.* must|must .*{key}") as info:
        Preprocess(**fields)
    assert "got" in str(info.value)  # and what was given


@pytest.mark.parametrize("fields,match", [
    (dict(resolution=(0, 32)), "resolution"), (dict(resolution=(32, 10**6)), "resolution"),
    (dict(resolution=(32.5, 32)), "resolution"), (dict(patch_size=0), "patch_size"),
    (dict(patch_size=-8), "patch_size"), (dict(patch_size=8.0), "patch_size")])
def test_preprocess_sizes_are_validated(fields, match):
    with pytest.raises(ValueError, match=match):
        Preprocess(**{**dict(resolution=(32, 32), patch_size=8, mean=(0.5,) * 3,
                             std=(0.5,) * 3), **fields})


@pytest.mark.parametrize("key,value", [("std", (1e-300,) * 3), ("std", (0.0,) * 3),
                                       ("mean", (1e300, 0, 0)), ("std", (float("nan"),) * 3)])
def test_a_config_with_absurd_normalisation_is_refused(key, value):
    with pytest.raises(ValueError, match=f"{key} must be 3 finite numbers from"):
        ViTConfig(**{key: value})


@pytest.mark.parametrize("flag,value", [
    ("--std", "0,0,0"), ("--std", "-1,1,1"), ("--std", "1e-300,1,1"), ("--std", "1e999,1,1"),
    ("--std", "nan,nan,nan"), ("--mean", "nan,0.5,0.5"), ("--mean", "inf,0,0"),
    ("--mean", "1e300,0,0"), ("--mean", "-1e5,0,0")])
@pytest.mark.parametrize("bare", [True, False])
def test_cli_preprocessing_flags_are_validated(source, tmp_path, flag, value, bare):
    given = {"--mean": "0.5,0.5,0.5", "--std": "0.5,0.5,0.5", flag: value}
    target = source / MODEL_FILE if bare else source
    r = _cli("predict", target, _image(tmp_path), "--res", "32", "--mean", given["--mean"],
             "--std", given["--std"])
    _assert_refused(r, f"{flag[2:]} must be", "finite numbers from")
    assert "nan" not in r.output.split("got")[0]  # no table of NaN probabilities


# -- 4. guards before allocation -------------------------------------------------------------
@pytest.fixture()
def resizes(monkeypatch):
    """The sizes images were resized to (Pillow's resize, spied on)."""
    from PIL import Image as PILImage

    seen = []
    real = PILImage.Image.resize

    def spy(self, size, *a, **kw):
        seen.append(tuple(size))
        return real(self, size, *a, **kw)
    monkeypatch.setattr(PILImage.Image, "resize", spy)
    return seen


@pytest.mark.parametrize("resize", ["shorter_side_center_crop", "patch_multiple"])
@pytest.mark.parametrize("given", [False, True])
def test_the_memory_guard_runs_before_preprocessing_allocates(source, resizes, resize, given):
    image = np.full((40, 50, 3), 9, np.uint8)
    with ViTSession(source) as s:
        pre = (Preprocess(resolution=(8192, 8192), patch_size=8, mean=(0.5,) * 3,
                          std=(0.5,) * 3, resize=resize) if given
               else s.preprocess(resolution=(8192, 8192), resize=resize))
        with pytest.raises(InputError, match="GiB"):
            s.predict(image, preprocess=pre)
        with pytest.raises(InputError, match="GiB"):  # as predict --features calls it
            s.preprocess(resolution=(8192, 8192), resize=resize)(image)
    assert resizes == []  # refused from the image's size alone


def test_cli_predict_at_8192_is_refused_before_any_resize(source, tmp_path, resizes):
    r = _cli("predict", source, _image(tmp_path), "--res", "8192")
    _assert_refused(r, "GiB")
    assert resizes == []


def test_export_refuses_a_size_before_building_the_model(tmp_path, monkeypatch):
    import vit_deploy.export.model as model_module

    def no_build(*a, **kw):
        raise AssertionError("the model was built before the memory guard ran")
    monkeypatch.setattr(model_module, "build_model", no_build)
    r = _cli("export", "--model", "L", "--res", "8192", "--out", tmp_path / "x")
    _assert_refused(r, "GiB")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("patch", ["0", "8,0", "-8", "2000", "0,0"])
def test_sweep_patch_zero_is_a_usage_error(source, patch):
    r = _cli("sweep", source / WEIGHTS_FILE, "--patch", patch)
    _assert_refused(r, "--patch", "patch sizes must be positive integers up to 1024")


@pytest.mark.parametrize("image_std", [[1e-300] * 3, [0, 0, 0], [1e300] * 3, 1e-9,
                                       [0.5, 0.5]])
def test_a_hf_checkpoint_with_absurd_image_std_writes_nothing(tmp_path, image_std):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=3, image_size=32,
        patch_size=8, intermediate_size=192, num_labels=5)).eval()
    ckpt = tmp_path / "hf"
    model.save_pretrained(ckpt)
    (ckpt / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.5, 0.5, 0.5], "image_std": image_std}))
    out = tmp_path / "out"
    r = _cli("export", "--checkpoint", ckpt, "--out", out, "--quiet")
    _assert_refused(r, "preprocessor_config.json", "image_std must be 3 finite numbers")
    assert not out.exists()


# -- the Node tests' hostile bundles (web/test/untrusted.test.mjs) ---------------------------
def write_hostile_bundles(source: Path, out: Path) -> None:
    """Copies of bundle `source` whose graph lies, each re-hashed (a consistent lie): nan /
    inf (the logits multiplied by NaN / Inf), collapse (ReduceMean over the batch),
    symbolic-5 (a width ORT cannot know, and 5 labels for its 10 classes)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, edit in (("nan", _poison(float("nan"))), ("inf", _poison(float("inf"))),
                       ("collapse", _collapse_batch("ReduceMean")),
                       ("symbolic-5", _symbolic_width)):
        b = _copy(source, out, name)
        _edit(b, lambda m: m.update(models={"fp32": MODEL_FILE}))  # fp32 only
        _rewrite_model(b, edit)
    _edit(out / "symbolic-5", lambda m: (m["config"].update(num_classes=5),
                                         m["io"]["outputs"][0].update(shape=["batch", 5]),
                                         m.update(labels=[f"c{i}" for i in range(5)])))


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python tests/runtime/test_untrusted_bundle.py BUNDLE OUT_DIR  (writes "
                 "the hostile bundles of web/test/untrusted.test.mjs)")
    write_hostile_bundles(Path(sys.argv[1]), Path(sys.argv[2]))
