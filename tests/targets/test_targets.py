"""`vit-deploy target`: bucket graphs checked against PyTorch, written atomically, used by
the runtime; ORT format and ORT's mobile checker for the mobile target."""

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.parity import sample_inputs
from vit_deploy.runtime import BundleError, Manifest, ViTSession, load_manifest
from vit_deploy.targets.build import TargetOptions, add_target


@pytest.fixture
def bundle(quantised_bundle, tmp_path):
    """A writable copy of the tiny int8 bundle (deploy 24x40)."""
    out = tmp_path / "b"
    shutil.copytree(quantised_bundle, out)
    return out


def _torch(bundle, x):
    from vit_deploy.export.checkpoints import load_model

    with torch.no_grad():
        return load_model(bundle / "weights.safetensors")(torch.from_numpy(x)).numpy()


def test_cpu_target_writes_checked_bucket_graphs_the_session_uses(bundle):
    (bundle / "notes.txt").write_text("mine")
    report = add_target(bundle, TargetOptions(target="cpu", buckets=((24, 40), (32, 32))))
    assert report and len(report.results) == 4  # 2 buckets x (fp32, int8: the bundle has it)
    m = load_manifest(bundle)  # every file hashed and verified
    spec = m.target("cpu")
    assert spec.resolutions == ((24, 40), (32, 32)) and spec.precisions == ("fp32", "int8")
    for g in spec.graphs:
        shape = ort.InferenceSession(str(bundle / g.file)).get_inputs()[0].shape
        assert shape == [1, 3, *g.resolution]  # fixed batch and size
    assert (bundle / "notes.txt").read_text() == "mine"
    x = sample_inputs((32, 32), 3, seed=3)  # batch 3 runs as 3 chunks of the batch-1 graph
    with ViTSession(bundle) as s:
        assert s.buckets is not None and s.buckets.covers((32, 32))
        out = s.run(x)
        assert (32, 32) in s.buckets._sessions  # it ran on the bucket graph
        s.run(sample_inputs((16, 16), 1))  # not a bucket: the dynamic graph
        assert (16, 16) not in s.buckets._sessions
    np.testing.assert_allclose(out, _torch(bundle, x), atol=1e-5)
    with ViTSession(bundle, target="none") as s:
        assert s.buckets is None
    with pytest.raises(BundleError, match="no 'mobile' target"):
        ViTSession(bundle, target="mobile")


def test_a_bucket_that_fails_parity_is_not_written(bundle, monkeypatch):
    import vit_deploy.export.static as static

    real = static.static_model

    def broken_at_32(model, h, w):  # a wrong position table at one size only
        out = real(model, h, w)
        if (h, w) == (32, 32):  # (a constant shift would vanish in LayerNorm: noise)
            noise = torch.Generator().manual_seed(0)
            out.token_table += torch.randn(out.token_table.shape, generator=noise)
        return out

    monkeypatch.setattr(static, "static_model", broken_at_32)
    report = add_target(bundle, TargetOptions(target="cpu", buckets=((24, 40), (32, 32))))
    assert not report
    assert {(r.resolution, r.precision) for r in report.failed} == {((32, 32), "fp32"),
                                                                     ((32, 32), "int8")}
    spec = load_manifest(bundle).target("cpu")
    assert spec.resolutions == ((24, 40),)
    assert not list((bundle / "targets" / "cpu").glob("32x32*"))


def test_mobile_target_ort_format_and_the_mobile_checker(bundle):
    runner = CliRunner()
    r = runner.invoke(main, ["target", str(bundle), "--target", "mobile", "--buckets", "24x40",
                             "--quiet"])
    assert r.exit_code == 0, r.output
    spec = load_manifest(bundle).target("mobile")
    assert spec.required_operators and (bundle / spec.required_operators).is_file()
    assert "/tmp" not in (bundle / spec.required_operators).read_text()
    x = sample_inputs((24, 40), 1, seed=4)
    ref = _torch(bundle, x)
    for g in spec.graphs:  # each .ort loads here and matches PyTorch
        assert g.ort_file.endswith(".ort")
        out = ort.InferenceSession(str(bundle / g.ort_file)).run(None, {"pixel_values": x})[0]
        assert np.abs(out - ref).max() < (1e-4 if g.precision == "fp32" else 0.2)
    check = spec.record["mobile_check"]
    for ep in ("CoreML MLProgram", "NNAPI"):  # one partition over every node, both EPs
        static = check["static 24x40 b1 fp32"][ep]
        assert static["partitions"] == 1 and static["supported_nodes"] == static["nodes"], ep
        assert static["verdict"] == "YES" or "verdict" not in static
    before = check["dynamic graph (model.onnx, as exported)"]["CoreML MLProgram"]
    assert before["supported_nodes"] < before["nodes"]
    info = runner.invoke(main, ["info", str(bundle)])
    assert info.exit_code == 0 and "target mobile" in info.output
    assert "CoreML MLProgram" in info.output and "1 partition(s)" in info.output


def test_bad_requests_exit_2_with_what_was_expected(bundle):
    runner = CliRunner()
    r = runner.invoke(main, ["target", str(bundle), "--target", "cpu", "--buckets", "30"])
    assert r.exit_code == 2 and "multiple of the patch size 8" in r.output
    r = runner.invoke(main, ["target", str(bundle), "--target", "npu", "--buckets", "32"])
    assert r.exit_code == 2 and "int8-static" in r.output and "quantize" in r.output
    r = runner.invoke(main, ["target", str(bundle), "--target", "cpu", "--buckets", "32,32"])
    assert r.exit_code == 2 and "buckets must differ" in r.output
    assert "targets" not in json.loads((bundle / MANIFEST_NAME).read_text())


def test_manifest_targets_are_validated_and_round_trip(bundle):
    add_target(bundle, TargetOptions(target="cpu", buckets=((32, 32),)))
    data = json.loads((bundle / MANIFEST_NAME).read_text())
    assert Manifest.from_dict(data).to_dict() == data
    bad = json.loads(json.dumps(data))
    bad["targets"]["cpu"]["graphs"][0]["file"] = "elsewhere.onnx"
    with pytest.raises(BundleError, match="file and ort_file: files listed under files"):
        Manifest.from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["targets"]["cpu"]["graphs"][0]["resolution"] = [30, 32]
    with pytest.raises(BundleError, match="multiples of 8"):
        Manifest.from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["targets"]["phone"] = bad["targets"].pop("cpu")
    with pytest.raises(BundleError, match="names from"):
        Manifest.from_dict(bad)
    del data["targets"]  # bundles written before targets: none
    assert Manifest.from_dict(data).targets == {}


def test_adding_a_target_again_replaces_its_files(bundle):
    add_target(bundle, TargetOptions(target="cpu", buckets=((32, 32),)))
    add_target(bundle, TargetOptions(target="cpu", buckets=((24, 40),)))
    m = load_manifest(bundle)
    assert m.target("cpu").resolutions == ((24, 40),)
    assert sorted(p.name for p in (bundle / "targets" / "cpu").iterdir()) == sorted(
        n.split("/")[-1] for n in m.target("cpu").files())


def test_gpu_check_says_there_is_no_cuda_and_exits_non_zero(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from vit_deploy.runtime.providers import probe

    if probe("cuda").usable:
        pytest.skip("CUDA really runs here: the GPU check would run, not refuse")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=root,
                       env={"BIN": str(Path(sys.executable).parent), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0
    assert "CUDA is not available" in r.stderr and "no GPU figures" in r.stderr
    assert list((tmp_path / "out").iterdir()) == []
