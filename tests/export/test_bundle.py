import hashlib
import json

import onnx
import pytest

import vit_deploy.export.bundle as bundle_mod
from vit_deploy.runtime.swap import OutputExistsError
from vit_deploy.export.checkpoints import load_model
from vit_deploy.runtime.contract import MANIFEST_NAME, MODEL_FILE, WEIGHTS_FILE
from vit_deploy.runtime.references import REFERENCES_FILE
from vit_deploy.export.bundle import ExportOptions, export_bundle, parity_resolutions
from vit_deploy.parity import ParityError
from vit_deploy.runtime.manifest import load_manifest


def test_manifest_describes_the_bundle(tiny_bundle):
    model, result = tiny_bundle
    manifest = load_manifest(result.path)  # verifies sizes and hashes
    assert sorted(p.name for p in result.path.iterdir()) == sorted(
        [MANIFEST_NAME, MODEL_FILE, WEIGHTS_FILE, REFERENCES_FILE])
    assert manifest.files[REFERENCES_FILE].role == "references"  # golden outputs (issue 27)
    assert manifest.config == model.cfg
    assert manifest.models == {"fp32": MODEL_FILE}
    assert manifest.files[MODEL_FILE].sha256 == hashlib.sha256(
        (result.path / MODEL_FILE).read_bytes()).hexdigest()
    assert manifest.files[MODEL_FILE].size == (result.path / MODEL_FILE).stat().st_size
    assert manifest.io.inputs[0].shape == ("batch", 3, "height", "width")
    assert manifest.preprocess.resolution == (48, 64)
    assert manifest.preprocess.mean == model.cfg.mean
    assert {"torch", "onnx", "onnxruntime-gpu"} <= set(manifest.versions)
    assert manifest.parity["passed"] is True
    simp = manifest.export["simplify"]
    assert simp["kept"] and simp["nodes_after"] <= simp["nodes_before"]
    assert manifest.export["nodes"] == simp["nodes_after"] == len(
        onnx.load(str(result.path / MODEL_FILE)).graph.node)


def test_parity_covers_requested_native_nonsquare_smallest_and_odd(tiny_bundle):
    model, result = tiny_bundle
    labels = {c["label"] for c in result.manifest.parity["cases"]}
    for hw in ["48x64", "32x32", "160x240", "8x8", "56x72"]:
        assert {f"{hw} b1", f"{hw} b3"} <= labels
    subjects = {c["subject"] for c in result.manifest.parity["checks"]}
    assert subjects == {"pytorch", "onnxruntime:cpu"}


def test_weights_in_bundle_rebuild_the_model(tiny_bundle):
    import torch

    model, result = tiny_bundle
    again = load_model(result.path / WEIGHTS_FILE)
    x = torch.randn(1, 3, 24, 24)
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_parity_failure_leaves_nothing(tmp_path, monkeypatch, make_tiny):
    import vit_deploy.parity as parity_mod

    real_judge = parity_mod.judge

    def broken(ref, out, **kw):
        return real_judge(ref, out + 1.0, **kw)

    monkeypatch.setattr(parity_mod, "judge", broken)
    out = tmp_path / "b"
    with pytest.raises(ParityError, match="parity failed") as info:
        export_bundle(make_tiny(), out, options=ExportOptions(simplify=False))
    report = info.value.report
    assert len(report.cases) == 10  # 5 sizes (requested = native here) x 2 batches
    assert len(report.failures) == len(report.cases)  # every case is listed, not just the first
    assert list(tmp_path.iterdir()) == []


def test_parity_failure_keeps_the_previous_bundle(tmp_path, monkeypatch, make_tiny):
    out = tmp_path / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(simplify=False))
    before = (out / MANIFEST_NAME).read_bytes()
    monkeypatch.setattr(bundle_mod, "_verify", lambda *a: bundle_mod.ParityReport(
        cases=[], checks=[bundle_mod.batch_independence(lambda x: x.sum() + x[:, :1, 0, 0], (8, 8),
                                                        subject="broken")]))
    with pytest.raises(ParityError):
        export_bundle(make_tiny("factorized"), out, options=ExportOptions(simplify=False))
    assert (out / MANIFEST_NAME).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["b"]


def test_existing_bundle_is_replaced_other_directories_are_not(tmp_path, make_tiny):
    out = tmp_path / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(simplify=False))
    export_bundle(make_tiny("factorized"), out, options=ExportOptions(simplify=False))
    assert json.loads((out / MANIFEST_NAME).read_text())["config"]["pos_embed"] == "factorized"
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match="not a bundle.*--force"):
        export_bundle(make_tiny(), other)
    assert (other / "notes.txt").read_text() == "keep me"


def test_static_bundle(tmp_path, make_tiny):
    result = export_bundle(make_tiny(), tmp_path / "s",
                           options=ExportOptions(resolution=(24, 40), static=True))
    m = result.manifest
    assert m.io.dynamic is False and m.io.inputs[0].shape == ("batch", 3, 24, 40)
    assert {c["label"] for c in m.parity["cases"]} == {"24x40 b1", "24x40 b3"}


def test_parity_resolutions_for_b16_cover_the_done_sizes():
    from vit_deploy.runtime.config import variant

    class Stub:
        cfg = variant("B/16")

    res = parity_resolutions(Stub(), (448, 448), static=False)  # type: ignore[arg-type]
    assert {(448, 448), (224, 224), (320, 480), (16, 16), (32, 64)} <= set(res)
    assert any(h // 16 % 2 and w // 16 % 2 for h, w in res)  # a grid with odd sides
    assert (1, 1) in {(h // 16, w // 16) for h, w in res}  # the smallest grid
    assert len(res) == len(set(res))  # no size twice
