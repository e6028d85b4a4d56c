"""The npu target on Qualcomm's HTP backend, emulated (targets/htp.py, onnxruntime-qnn in
.venv-qnn, which `make setup` makes): the trained digits ViT's npu graph (per-channel int8
weights on 2-D Gemms) finalises on two HTP architectures with every node on HTP and matches
PyTorch's golden references; per-channel weights on MatMuls are reported with the nodes HTP
refused."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.targets import htp

ROOT = Path(__file__).resolve().parents[2]
QNN_PYTHON = ROOT / ".venv-qnn" / "bin" / "python"
DIGITS = ROOT / "vit_deploy" / "data" / "digits_vit.safetensors"


@pytest.fixture(scope="module")
def qnn_python() -> Path:
    if not QNN_PYTHON.is_file():
        pytest.fail(f"{QNN_PYTHON} is missing: `make test` makes it (make setup: .venv-qnn "
                    f"with {htp.QNN_PACKAGE})")
    return QNN_PYTHON


def _npu_bundle(out: Path, *target_flags: str) -> Path:
    for args in (["export", "--checkpoint", DIGITS, "--out", out],
                 ["quantize", out, "--precision", "int8-static"],
                 ["target", out, "--target", "npu", "--buckets", "32", "--calib", "digits",
                  *target_flags]):
        r = CliRunner().invoke(main, [str(a) for a in args])
        assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def npu_bundle(tmp_path_factory) -> Path:
    """The npu target as built: per-channel weights, linear layers as Gemms."""
    return _npu_bundle(tmp_path_factory.mktemp("htp") / "digits")


def test_the_npu_graph_runs_wholly_on_htp_and_matches_pytorch(npu_bundle, qnn_python):
    results = htp.check_htp(npu_bundle, python=qnn_python, archs={"73": "57", "75": "69"})
    assert [(r.htp_arch, r.file) for r in results] == [
        ("73", "targets/npu/32x32.b1.int8-static.onnx"),
        ("75", "targets/npu/32x32.b1.int8-static.onnx")]
    for r in results:
        assert r.finalised and r.error is None and r.cpu_nodes == [] and r.htp_partitions == 1
        assert r.parity and all(c.passed and c.cosine >= 0.99 for c in r.parity), r.line()
        # and on held-out digits (its calibration's kind) against the fp32 graph
        assert [(c.output, c.images) for c in r.photos] == [("logits", htp.DIGITS_JUDGED)]
        assert all(c.passed and c.cosine_min >= 0.99 for c in r.photos), r.photos
        assert r.passed and r.line().startswith("PASS") and "every node on HTP" in r.line()
    record = load_manifest(npu_bundle).targets["npu"].record
    assert "weights" not in record and record["linear_layers"].startswith("Gemm")


def test_a_bucket_the_references_left_out_is_judged_against_pytorch_here(
        npu_bundle, qnn_python, monkeypatch, tmp_path):
    """Large outputs (DINOv2-S's patch tokens) can leave a bucket out of the references'
    size bound: PyTorch, rebuilt from the bundle's weights, makes its cases here."""
    real = htp.iter_references
    monkeypatch.setattr(htp, "iter_references", lambda *a: [
        (case, x, out) for case, x, out in real(*a) if case.target != "npu"])
    # through the check command: its report, a line per graph and architecture, and JSON
    out = tmp_path / "htp.json"
    r = CliRunner().invoke(main, ["check", str(npu_bundle), "--provider", "qnn-htp",
                                  "--htp-arch", "73", "--htp-python", str(qnn_python),
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("PASS targets/npu/32x32.b1.int8-static.onnx htp_arch 73")
    report = json.loads(out.read_text())
    [graph] = report["graphs"]
    assert report["provider"] == "qnn-htp" and graph["passed"] and graph["cpu_nodes"] == []
    [case] = graph["parity"]  # PyTorch's, made here: one case of two graph batches
    assert case["passed"] and case["cosine"] >= 0.99 and case["provider"] == "qnn-htp 73"
    assert [p["output"] for p in graph["photos"]] == ["logits"]


def test_per_channel_matmul_weights_are_reported_as_the_nodes_htp_refused(
        tmp_path, qnn_python, capsys, monkeypatch):
    """The linear layers left as MatMuls (what every other target writes)."""
    import vit_deploy.export.static as static

    monkeypatch.setattr(static, "linears_as_gemm", lambda proto: 0)
    bundle = _npu_bundle(tmp_path / "matmul")
    [r] = htp.check_htp(bundle, python=qnn_python, archs={"73": "57"})
    assert not r.finalised and "CPU" in r.error
    assert r.cpu_nodes and {n["op"] for n in r.cpu_nodes} == {"DequantizeLinear"}
    assert not r.passed and r.line().startswith("FAIL")
    assert htp.main([str(bundle), "--python", str(qnn_python), "--arch", "73"]) == 1
    assert "node(s) on the CPU: ['DequantizeLinear']" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_2(npu_bundle, tmp_path, capsys, qnn_python):
    assert htp.main([str(npu_bundle), "--arch", "71"]) == 2
    assert "expected HTP architectures of ['73', '75', '79'], got '71'" in capsys.readouterr().err
    assert htp.main([str(npu_bundle), "--python", str(tmp_path / "nope")]) == 2
    assert "is not a file" in capsys.readouterr().err
    for args, said in ((["--provider", "cpu,qnn-htp"], "check it apart from cpu"),
                       (["--provider", "qnn-htp", "--htp-arch", "68"], "got '68'")):
        r = CliRunner().invoke(main, ["check", str(npu_bundle), *args])
        assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output
    # a Python without onnxruntime-qnn, and a program that is no Python: one line each
    assert htp.main([str(npu_bundle), "--python", sys.executable]) == 2
    assert "onnxruntime-qnn is not installed in" in capsys.readouterr().err
    assert htp.main([str(npu_bundle), "--python", shutil.which("true")]) == 2
    assert "it wrote no result" in capsys.readouterr().err
    plain = tmp_path / "plain"
    assert CliRunner().invoke(main, ["export", "--model", "tiny", "--out", str(plain)]).exit_code == 0
    assert htp.main([str(plain), "--python", str(qnn_python)]) == 2
    assert "has no npu target" in capsys.readouterr().err


def test_a_runner_past_its_time_is_stopped_and_said_in_one_line(npu_bundle, tmp_path, capsys,
                                                               monkeypatch):
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")  # one process: the kill ends it
    slow.chmod(0o755)
    monkeypatch.setattr(htp, "RUNNER_SECONDS_PER_GRAPH", 0.5)
    assert htp.main([str(npu_bundle), "--arch", "73,75", "--python", str(slow)]) == 2
    said = capsys.readouterr().err.strip()
    assert "the HTP runner ran past 1.0 s" in said and "2 architecture(s)" in said, said
    assert len(said.splitlines()) == 1 and "Traceback" not in said


def test_the_checkouts_qnn_python_is_found_from_any_folder_and_never_in_it(qnn_python, tmp_path,
                                                                          monkeypatch):
    """.venv-qnn is looked for beside this Python's environment (a checkout's .venv, symlinks
    resolved), from any folder; never in the working folder: a downloaded folder holding
    `.venv-qnn/bin/python` had that program run by `check --provider qnn-htp`."""
    planted = tmp_path / "download" / ".venv-qnn" / "bin" / "python"
    planted.parent.mkdir(parents=True)
    planted.write_text("#!/bin/sh\necho ran > planted-ran\n")
    monkeypatch.chdir(tmp_path / "download")
    assert htp.qnn_python().resolve() == qnn_python.resolve()  # make test runs in ROOT/.venv
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "download" / "env"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda *a, **k: None)
    # the environment beside the planted one: found (that is where make setup puts it) ...
    assert htp.qnn_python() == planted.resolve()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere" / "env"))
    with pytest.raises(ValueError) as e:  # ... but from the working folder alone: never
        htp.qnn_python()
    said = str(e.value)
    assert str(tmp_path / "elsewhere" / ".venv-qnn" / "bin" / "python") in said
    assert "download" not in said
    (tmp_path / "real-env").mkdir()  # a symlinked environment: beside its target
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "env").symlink_to(tmp_path / "real-env")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "links" / "env"))
    with pytest.raises(ValueError, match=str(tmp_path / ".venv-qnn" / "bin" / "python")):
        htp.qnn_python()


def test_compiled_contexts_are_written_reloaded_and_hashed_in_the_manifest(npu_bundle, tmp_path,
                                                                           qnn_python):
    bundle = tmp_path / "with-contexts"
    shutil.copytree(npu_bundle, bundle)
    before = set(load_manifest(bundle).files)
    [r] = htp.check_htp(bundle, python=qnn_python, archs={"75": "69"}, contexts=True)
    assert r.passed and r.context["max_abs"] == 0.0, r.line()
    assert "compiled context: reloaded, max|Δ| 0.0e+00" in r.line()
    manifest = load_manifest(bundle)  # every file's size and hash verified
    [graph] = manifest.targets["npu"].graphs
    assert graph.contexts == (("75", "targets/npu/32x32.b1.int8-static.htp75.onnx"),)
    assert set(manifest.files) - before == {"targets/npu/32x32.b1.int8-static.htp75.onnx"}
    context = onnx.load(str(bundle / graph.contexts[0][1]))
    assert [n.op_type for n in context.graph.node] == ["EPContext"]
    assert str(tmp_path) not in context.SerializeToString().decode("latin-1")  # no local path
    # a second architecture joins the first; the graphs and every other file stay
    htp.check_htp(bundle, python=qnn_python, archs={"73": "57"}, contexts=True)
    [graph] = load_manifest(bundle).targets["npu"].graphs
    assert [a for a, _ in graph.contexts] == ["73", "75"]
    assert set(load_manifest(bundle).files) - before == {
        f"targets/npu/32x32.b1.int8-static.htp{a}.onnx" for a in ("73", "75")}


def test_w8a16_graph_runs_wholly_on_htp_with_uint16_activations(tmp_path, qnn_python):
    """16-bit activations, int8 weights: how Qualcomm's NPUs run ViTs."""
    bundle = _npu_bundle(tmp_path / "w8a16", "--activations", "16")
    target = load_manifest(bundle).targets["npu"]
    assert target.record["activations"] == "uint16 (w8a16)"
    graph = onnx.load(str(bundle / target.graphs[0].file))
    quantise = [n for n in graph.graph.node if n.op_type == "QuantizeLinear"]
    zero_points = {i.name: i.data_type for i in graph.graph.initializer}
    assert quantise and {zero_points[n.input[2]] for n in quantise} == {onnx.TensorProto.UINT16}
    [r] = htp.check_htp(bundle, python=qnn_python, archs={"73": "57"})
    assert r.passed and not r.cpu_nodes, r.line()
    assert all(c.cosine_min >= 0.99 for c in r.photos), r.photos
    r = CliRunner().invoke(main, ["target", str(bundle), "--target", "cpu", "--buckets", "32",
                                  "--activations", "16"])
    assert r.exit_code == 2 and "16-bit activations are for the npu target" in r.output
