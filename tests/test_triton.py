"""Triton repository: validated with Triton's own protobuf; model names checked by one rule."""

import dataclasses
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2

from vit_deploy.cli import main
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.precisions.add import add_precisions
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.manifest_parts import TensorSpec
from vit_deploy.triton import (check_model_name, model_metadata, pbtxt_string, triton_config,
                               triton_repository)

# Every test here runs on the tiny bundle's first kind only (conftest: ONE_TINY_KIND_FILES).
TRICKY = ["../x", "a/b", "", ".", "..", 'x"y', "a\\b", "x\ny", ".hidden", "a" * 129, "a" * 128,
          "vit", "A.b-c_9", "-x", "x.", "é", "a b", "\x00", "/abs", "x/..", "C:x", "con"]


def _parse(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_triton_repository_parses_with_tritons_protobuf(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    repo = tmp_path / "repo"
    r = CliRunner().invoke(main, ["triton", str(result.path), "--out", str(repo), "--name", "vit",
                                  "--max-batch", "16", "--instances", "cpu:2,gpu:1",
                                  "--dynamic-batching-us", "500", "--accelerator", "tensorrt-fp16"])
    assert r.exit_code == 0, r.output
    config = _parse(repo / "vit" / "config.pbtxt")
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 16
    assert config.input[0].name == "pixel_values" and list(config.input[0].dims) == [3, -1, -1]
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    assert config.output[0].name == "logits" and list(config.output[0].dims) == [10]
    assert [(g.kind, g.count) for g in config.instance_group] == [
        (model_config_pb2.ModelInstanceGroup.KIND_CPU, 2),
        (model_config_pb2.ModelInstanceGroup.KIND_GPU, 1)]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    accel = config.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accel.name == "tensorrt" and accel.parameters["precision_mode"] == "FP16"
    assert (repo / "vit" / "1" / "model.onnx").read_bytes() == (result.path / "model.onnx").read_bytes()
    assert config.parameters["vit_deploy_precision"].string_value == "fp32"
    purpose = load_manifest(result.path).purpose  # what the bundle is for, for a client
    assert config.parameters["vit_deploy_purpose"].string_value == purpose.kind
    assert config.parameters["vit_deploy_classifier"].string_value == "logits"
    assert ("vit_deploy_embedding" in config.parameters) == (purpose.embedding is not None)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_config_lists_every_tensor_of_the_manifest_as_the_v2_metadata_does(tiny_bundle, static):
    """config.pbtxt and `vit-deploy serve`'s /v2/models/NAME come from model_metadata: every
    output the manifest lists (dense ones too), symbolic dims as -1, batch dim implicit."""
    manifest = load_manifest(tiny_bundle[1].path)
    extra = (TensorSpec("pooled", "float32", ("batch", 48)),
             TensorSpec("patch_tokens", "float32", ("batch", 48, "grid_height", "grid_width")))
    io = dataclasses.replace(manifest.io, outputs=(*manifest.io.outputs, *extra))
    if static:
        io = dataclasses.replace(io, dynamic=False, inputs=(TensorSpec(
            "pixel_values", "float32", ("batch", 3, 48, 64)),))
    manifest = dataclasses.replace(manifest, io=io)
    config = text_format.Parse(triton_config(
        manifest, name="vit", precision="fp32", max_batch=4, instances=[("cpu", 1)],
        dynamic_batching_us=None, accelerator=None), model_config_pb2.ModelConfig())
    assert list(config.input[0].dims) == ([3, 48, 64] if static else [3, -1, -1])
    assert [(o.name, list(o.dims)) for o in config.output] == [
        ("logits", [10]), ("pooled", [48]), ("patch_tokens", [48, -1, -1])]
    meta = model_metadata(manifest, "vit")
    for tensors, specs in ((config.input, meta.inputs), (config.output, meta.outputs)):
        assert [(t.name, model_config_pb2.DataType.Name(t.data_type), [-1, *t.dims])
                for t in tensors] == [(s.name, f"TYPE_{s.datatype}", list(s.shape)) for s in specs]


def test_a_dtype_without_a_v2_datatype_is_refused(tiny_bundle):
    manifest = load_manifest(tiny_bundle[1].path)
    odd = TensorSpec("logits", "complex64", ("batch", 10))
    manifest = dataclasses.replace(manifest, io=dataclasses.replace(manifest.io, outputs=(odd,)))
    with pytest.raises(ValueError, match="'complex64' has no Open Inference Protocol datatype"):
        model_metadata(manifest, "vit")


def test_triton_turns_dynamic_batching_off_for_batch_coupled_int8(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(result.path, bundle)
    add_precisions(bundle, ["int8"])
    r = CliRunner().invoke(main, ["triton", str(bundle), "--out", str(tmp_path / "repo"),
                                  "--precision", "int8"])
    assert r.exit_code == 0 and "dynamic batching" in r.output
    assert not _parse(tmp_path / "repo" / "b" / "config.pbtxt").HasField("dynamic_batching")


@pytest.mark.parametrize("args,message", [(["--instances", "tpu:1"], "instances must look like"),
                                          (["--precision", "int4"], "no 'int4' model")])
def test_triton_bad_arguments(tiny_bundle, tmp_path, args, message):
    _, result = tiny_bundle
    r = CliRunner().invoke(main, ["triton", str(result.path), "--out", str(tmp_path / "r"), *args])
    assert r.exit_code == 2 and message in r.output and not (tmp_path / "r").exists()


def _write(bundle: Path, name: str | None, work: Path):
    """(config, model directory) after writing a repository named `name`, or ValueError."""
    out = work / "repo"
    triton_repository(bundle, out, name=name, force=True)
    written = [p for p in out.iterdir() if p.name != MANIFEST_NAME]
    assert len(written) == 1, written  # exactly one model directory, and it is inside out
    assert written[0].resolve().parent == out.resolve()
    return _parse(written[0] / "config.pbtxt"), written[0]


def _check_name_everywhere(bundle: Path, name: str, work: Path) -> str:
    """A name is either accepted and round-trips, or rejected with ValueError everywhere."""
    try:
        check_model_name(name)
    except ValueError as e:
        assert "A-Z a-z 0-9 _ . -" in str(e) and "got " in str(e)
        with pytest.raises(ValueError, match="Triton model name must be"):
            triton_repository(bundle, work / "repo", name=name)
        assert not (work / "repo").exists()
        return "rejected"
    config, directory = _write(bundle, name, work)
    assert config.name == name and directory.name == name
    assert (directory / "1" / "model.onnx").is_file()
    return "accepted"


@pytest.mark.parametrize("name", TRICKY, ids=repr)
def test_model_names(tiny_bundle, tmp_path, name):
    _check_name_everywhere(tiny_bundle[1].path, name, tmp_path)


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".", 'x"y'], ids=repr)
def test_bad_names_are_rejected_by_the_cli(tiny_bundle, tmp_path, name):
    r = CliRunner().invoke(main, ["triton", str(tiny_bundle[1].path), "--out",
                                  str(tmp_path / "r"), "--name", name])
    assert r.exit_code == 2 and "Triton model name must be" in r.output, r.output
    assert not (tmp_path / "r").exists() and not (tmp_path / "x").exists()


def test_default_name_is_checked_too(tiny_bundle, tmp_path):
    bundle = tmp_path / "my bundle"
    shutil.copytree(tiny_bundle[1].path, bundle)
    r = CliRunner().invoke(main, ["triton", str(bundle), "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "bundle directory's name" in r.output
    assert "pass --name" in r.output and "'my bundle'" in r.output
    r = CliRunner().invoke(main, ["triton", str(bundle), "--out", str(tmp_path / "r"),
                                  "--name", "my_bundle"])
    assert r.exit_code == 0, r.output
    assert _parse(tmp_path / "r" / "my_bundle" / "config.pbtxt").name == "my_bundle"


names = st.one_of(st.text(max_size=140),
                  st.from_regex(r"[A-Za-z0-9_.\-]{1,130}", fullmatch=True),
                  st.text(alphabet="./\\\"-_a ", max_size=8),
                  st.sampled_from(TRICKY))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names)
def test_any_name_is_accepted_safely_or_rejected(tiny_bundle, tmp_path_factory, name):
    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as work:
        event(_check_name_everywhere(tiny_bundle[1].path, name, Path(work)))


@settings(max_examples=300, deadline=None)
@given(value=st.text())
def test_pbtxt_strings_round_trip(value):
    text = (f"name: {pbtxt_string(value)}\nparameters {{ key: {pbtxt_string(value)} value: "
            f"{{ string_value: {pbtxt_string(value)} }} }}\n")
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.name == value and config.parameters[value].string_value == value
    assert pbtxt_string(value).isascii() and "\n" not in pbtxt_string(value)
