import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from vit_deploy.check import CheckOptions, run_check
from vit_deploy.cli import main
from vit_deploy.contract import MODEL_FILE
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.precisions import add_precisions
from vit_deploy.parity import batch_independence
from vit_deploy.runtime import RuntimeOptions, ViTSession


@pytest.fixture(scope="module")
def quantised_bundle(tmp_path_factory, make_tiny):
    out = tmp_path_factory.mktemp("check") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(resolution=(24, 40), simplify=False))
    add_precisions(out, ["int8", "int4"])
    return out


def test_check_every_case_against_pytorch(quantised_bundle):
    report = run_check(quantised_bundle, CheckOptions(providers=("cpu", "openvino"),
                                                      batches=(1, 3)))
    assert report, report.to_markdown()  # CheckReport is true when every case passed
    labels = {(c.label, c.precision) for c in report.parity.cases}
    for p in ("fp32", "int8", "int4"):
        for res in ("24x40", "32x32"):
            assert {(f"{res} b1", p), (f"{res} b3", p)} <= labels
    assert all(c.provider == "cpu" for c in report.parity.cases)
    names = {(k.name, k.subject) for k in report.parity.checks}
    assert ("batch-independence", "cpu:int8") in names and ("determinism", "cpu:fp32") in names
    assert "openvino" in report.unavailable  # reported, not skipped
    md = report.to_markdown()
    assert "| 24x40 b3 | cpu | int8 |" in md and "openvino: not available" in md
    assert json.loads(report.to_json())["passed"] is True


def test_require_makes_an_unavailable_provider_fail(quantised_bundle, tmp_path):
    r = CliRunner().invoke(main, ["check", str(quantised_bundle), "--providers", "cpu,openvino",
                                  "--precision", "fp32", "--batch", "1", "--require",
                                  "--json", str(tmp_path / "c.json"),
                                  "--markdown", str(tmp_path / "c.md")])
    assert r.exit_code == 1 and "openvino: not available here (required)" in r.output
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["passed"] is False and data["unavailable"]["openvino"]
    assert (tmp_path / "c.md").read_text().startswith("# vit-deploy check")


def test_corrupted_bundle_fails_check(quantised_bundle, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(quantised_bundle, bad)
    data = bytearray((bad / MODEL_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / MODEL_FILE).write_bytes(bytes(data))
    r = CliRunner().invoke(main, ["check", str(bad)])
    assert r.exit_code != 0 and "sha256" in r.output and "Traceback" not in r.output


def test_wrong_model_fails_check_with_a_table(quantised_bundle, tmp_path, make_tiny):
    other = tmp_path / "other"
    export_bundle(make_tiny("factorized"), other, options=ExportOptions(simplify=False))
    swapped = tmp_path / "swapped"
    shutil.copytree(quantised_bundle, swapped)
    shutil.copy(other / "weights.safetensors", swapped / "weights.safetensors")
    manifest = json.loads((swapped / "manifest.json").read_text())
    manifest["files"]["weights.safetensors"] = json.loads(
        (other / "manifest.json").read_text())["files"]["weights.safetensors"]
    (swapped / "manifest.json").write_text(json.dumps(manifest))
    r = CliRunner().invoke(main, ["check", str(swapped), "--precision", "fp32", "--batch", "1"])
    assert r.exit_code == 1 and "FAIL" in r.output


def test_dynamic_int8_couples_a_batch_so_the_session_splits_it(quantised_bundle):
    with ViTSession(quantised_bundle, precision="int8") as s:
        assert s.batch_coupled and s.split_batches
        assert batch_independence(s.run, (24, 40), subject="split").passed
    with ViTSession(quantised_bundle, precision="int8",
                    options=RuntimeOptions(split_batches=False)) as s:
        # one activation scale per tensor: other images move when one changes
        assert not batch_independence(s.run, (24, 40), subject="batched").passed
    with ViTSession(quantised_bundle, precision="int4") as s:
        assert not s.batch_coupled


def test_bench_plot_and_budget(quantised_bundle, tmp_path):
    png, j = tmp_path / "p.png", tmp_path / "b.json"
    r = CliRunner().invoke(main, ["bench", str(quantised_bundle), "--precision", "fp32,int8",
                                  "--res", "16,32,64", "--runs", "3", "--warmup", "0",
                                  "--sessions", "1", "--plot", str(png), "--json", str(j),
                                  "--budget-ms", "10000"])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    budget = json.loads(j.read_text())["budget"]
    assert {b["precision"] for b in budget} == {"fp32", "int8"}
    assert all(b["resolution"] == [64, 64] for b in budget)  # everything fits 10 s
    assert "within 10000 ms p90 at batch 1 on cpu fp32: up to 64x64" in r.output
    assert np.isfinite([b["p90_ms"] for b in budget]).all()
