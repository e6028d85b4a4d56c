"""The typed manifest: round trip, values validated, v1 bundles read, lies refused."""

import copy
import json
import math
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vit_deploy.runtime.contract import BUNDLE_FORMAT_VERSION, MANIFEST_NAME
from vit_deploy.runtime import BundleError, ViTSession
from vit_deploy.runtime.manifest import Manifest, dumps_strict, load_manifest
from vit_deploy.runtime.manifest_parts import FileEntry
from vit_deploy.runtime.ort_session import RuntimeOptions

V1 = Path(__file__).parent.parent / "data" / "manifest-v1.json"


@pytest.fixture(scope="module")
def valid(tiny_bundle) -> dict:
    _, result = tiny_bundle
    return json.loads((result.path / MANIFEST_NAME).read_text())


def test_round_trip_is_exact(valid):
    m = Manifest.from_dict(valid)
    assert m.format_version == BUNDLE_FORMAT_VERSION
    again = json.loads(m.to_json())
    assert again == valid
    assert Manifest.from_json(m.to_json()) == m


def test_the_questions_callers_ask(tiny_bundle):
    _, result = tiny_bundle
    m = load_manifest(result.path)
    assert m.model_file("fp32") == "model.onnx"
    assert m.weights_file == "weights.safetensors"
    assert m.deploy_resolution == (48, 64)
    assert m.allows((16, 24)) and not m.allows((20, 24))
    with pytest.raises(BundleError, match="has no 'int8' model; it has \\['fp32'\\].*quantize"):
        m.model_file("int8")
    with pytest.raises(ValueError, match="not a positive multiple of the patch size 8"):
        m.require_size((20, 24))


def test_a_v1_bundle_is_read_and_runs(tiny_bundle, tmp_path):
    """A manifest written by the exporter before the typed manifest (format v1, committed as
    written), pointed at this session's files: read, verified, run; a rewrite makes it v2."""
    _, result = tiny_bundle
    b = tmp_path / "v1"
    shutil.copytree(result.path, b)
    shutil.copy(b / "model.onnx", b / "model.int8.onnx")
    old = json.loads(V1.read_text())
    assert old["format_version"] == 1
    for name, entry in old["files"].items():
        entry.update(asdict(FileEntry.of(b / name, entry["role"])))
    old["preprocess"]["resolution"] = [48, 64]
    (b / MANIFEST_NAME).write_text(json.dumps(old))
    m = load_manifest(b)
    assert m.format_version == 1 and m.labels[3] == "digit-3"
    assert m.batch_coupled("int8") and not m.batch_coupled("fp32")
    with ViTSession(b) as s:
        assert s.predict([__import__("numpy").zeros((48, 64, 3), "uint8")])[0].top[0].label
    m2 = m.with_precision("fp16", "model.onnx", m.files["model.onnx"], {"file": "model.onnx"})
    assert m2.format_version == BUNDLE_FORMAT_VERSION


def test_a_v1_manifest_without_file_roles_gets_the_roles_v1_meant(tiny_bundle, tmp_path):
    """v1 could leave roles out: the weights file and the models are still known as such,
    so check rebuilds PyTorch from the weights instead of saying there are none."""
    from click.testing import CliRunner

    from vit_deploy.cli import main

    _, result = tiny_bundle
    b = tmp_path / "v1"
    shutil.copytree(result.path, b)
    shutil.copy(b / "model.onnx", b / "model.int8.onnx")
    old = json.loads(V1.read_text())
    for name, entry in old["files"].items():
        entry.update(asdict(FileEntry.of(b / name, entry["role"])))
        del entry["role"]
    old["preprocess"]["resolution"] = [48, 64]
    (b / MANIFEST_NAME).write_text(json.dumps(old))
    m = load_manifest(b)
    assert m.weights_file == "weights.safetensors"
    assert {n: e.role for n, e in m.files.items()} == {
        "model.onnx": "model:fp32", "model.int8.onnx": "model:int8",
        "weights.safetensors": "weights"}
    r = CliRunner().invoke(main, ["check", str(b), "--precision", "fp32", "--batch", "1"])
    assert r.exit_code == 0 and "rebuilt from the bundle's weights" in r.output, r.output


@pytest.mark.parametrize("damage,match", [
    (lambda m: m["preprocess"].update(mean=[float("nan"), 0, 0]), "preprocess.mean"),
    (lambda m: m["preprocess"].update(std=[1e-9, 1, 1]), "preprocess.std"),
    (lambda m: m["preprocess"].update(resolution=[8 * 10**5, 64]), "preprocess.resolution"),
    (lambda m: m["preprocess"].update(resolution=[50, 64]), "preprocess.resolution"),
    (lambda m: m["preprocess"].update(resize="stretch"), "preprocess.resize"),
    (lambda m: m["preprocess"].update(scale=-1), "preprocess.scale"),
    (lambda m: m.update(labels=[str(i) for i in range(11)]), "labels"),
    (lambda m: m.update(labels=[1] * 10), "labels"),
    (lambda m: m["config"].update(heads="3"), "config.heads"),
    (lambda m: m["config"].update(width=50), "not divisible by heads"),
    (lambda m: m["config"].update(patch_size=8.0), "config.patch_size"),
    (lambda m: m["io"].update(patch_size=16), "io.patch_size"),
    (lambda m: m["io"]["inputs"][0].update(shape=["batch", 4, "height", "width"]),
     "io.inputs"),
    (lambda m: m["files"].update({"../secret.onnx": m["files"]["model.onnx"]}), "files"),
    (lambda m: m["files"].update({"/etc/passwd": m["files"]["model.onnx"]}), "files"),
    (lambda m: m["models"].update(fp32="../model.onnx"), "models"),
    (lambda m: m["models"].pop("fp32"), "fp32 model"),
    (lambda m: m.update(export={"a": json.loads("[" * 20 + "]" * 20)}), "nested"),
])
def test_values_are_validated_not_only_types(valid, damage, match):
    m = copy.deepcopy(valid)
    damage(m)
    with pytest.raises(BundleError, match=match):
        Manifest.from_dict(m)
    with pytest.raises(BundleError):  # and as the file would hold it
        Manifest.from_json(json.dumps(m))


def test_deep_json_and_bare_nan_are_refused():
    with pytest.raises(BundleError, match="nested"):
        Manifest.from_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BundleError, match="not valid JSON"):
        Manifest.from_json('{"format": NaN}')


def test_without_verify_no_path_outside_the_bundle_is_opened(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    b = tmp_path / "b"
    shutil.copytree(result.path, b)
    (tmp_path / "outside.onnx").write_bytes((b / "model.onnx").read_bytes())
    (b / "model.onnx").unlink()
    (b / "model.onnx").symlink_to(tmp_path / "outside.onnx")  # a link leaving the bundle
    with pytest.raises(BundleError, match="outside the bundle"):
        ViTSession(b, options=RuntimeOptions(verify=False))


def test_strict_json_never_writes_nan():
    text = dumps_strict({"cosine": float("nan"), "x": [float("inf"), 1.0]})
    assert json.loads(text) == {"cosine": None, "x": [None, 1.0]}


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
PATHS = [("format_version",), ("config", "patch_size"), ("config", "width"), ("config", "heads"),
         ("config", "img_size"), ("config", "mean"), ("config", "num_classes"),
         ("preprocess", "resolution"), ("preprocess", "mean"), ("preprocess", "std"),
         ("preprocess", "scale"), ("preprocess", "interpolation"), ("io", "dynamic"),
         ("io", "inputs"), ("io", "outputs"), ("labels",), ("models",), ("files",),
         ("precisions",), ("export",), ("created",), ("versions",)]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(path=st.sampled_from(PATHS), value=JSON)
def test_any_field_set_to_any_json_value_loads_or_is_a_bundle_error(valid, path, value):
    m = copy.deepcopy(valid)
    target = m
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        loaded = Manifest.from_json(json.dumps(m))
    except BundleError:
        return
    text = loaded.to_json()  # whatever loads writes back as strict JSON
    assert "NaN" not in text and Manifest.from_json(text) == loaded
    assert all(math.isfinite(v) and v >= 1e-6 for v in loaded.preprocess.std)


@pytest.mark.parametrize("crop_pct,resize,match", [
    (0.05, "shorter_side_center_crop", r"preprocess.crop_pct must be null or a number from 0.1 to 1"),
    (1.5, "squash", r"from 0.1 to 1, got 1.5"),
    ("0.9", "squash", r"from 0.1 to 1, got '0.9'"),
    (0.9, "patch_multiple", r"null under the 'patch_multiple' rule"),
])
def test_crop_pct_is_validated(valid, crop_pct, resize, match):
    d = copy.deepcopy(valid)
    d["preprocess"].update(crop_pct=crop_pct, resize=resize)
    with pytest.raises(BundleError, match=match):
        Manifest.from_dict(d)


def test_crop_pct_round_trips_and_is_omitted_when_unset(valid):
    assert "crop_pct" not in Manifest.from_dict(valid).to_dict()["preprocess"]
    d = copy.deepcopy(valid)
    d["preprocess"].update(crop_pct=0.875, resize="squash")
    m = Manifest.from_dict(d)
    assert (m.preprocess.crop_pct, m.preprocess.resize) == (0.875, "squash")
    assert m.to_dict()["preprocess"]["crop_pct"] == 0.875


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    yield path


def test_a_list_or_object_in_place_of_any_name_is_a_bundle_error_not_a_type_error(valid):
    """`"contexts": {"73": [1, 2]}` or `"file": ["x"]` in a target graph gave `TypeError:
    unhashable type` (a traceback in info, check, predict). Every leaf of the targets, the
    references and the purpose, set to a list, an object or a string: loads or BundleError."""
    from vit_deploy.runtime.contract import TARGETS

    m = copy.deepcopy(valid)
    P = m["io"]["patch_size"]
    m["targets"] = {TARGETS[0]: {"batch": 1, "policy": "aspect-then-area", "record": {},
                                 "required_operators": None, "graphs": [
        {"resolution": [4 * P, 4 * P], "batch": 1, "precision": "fp32", "file": "model.onnx",
         "ort_file": None, "contexts": {"73": "model.onnx"}}]}}
    Manifest.from_json(json.dumps(m))  # the valid form loads
    tried = 0
    for part in ("targets", "references", "purpose"):
        for path in _leaves(m.get(part), (part,)):
            for value in ([1, 2], {"x": [1]}, "x", None):
                changed = copy.deepcopy(m)
                at = changed
                for key in path[:-1]:
                    at = at[key]
                if not path[1:]:
                    changed[part] = value
                else:
                    at[path[-1]] = value
                try:
                    Manifest.from_json(json.dumps(changed))
                except BundleError:
                    pass
                tried += 1
    assert tried > 100
