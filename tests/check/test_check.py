import json
import shutil

from click.testing import CliRunner

from vit_deploy.check.run import CheckOptions, run_check
from vit_deploy.cli import main
from vit_deploy.runtime.contract import MODEL_FILE
from vit_deploy.export.bundle import ExportOptions, export_bundle


def test_check_every_case_against_pytorch(quantised_bundle):
    report = run_check(quantised_bundle, CheckOptions(providers=("cpu", "coreml"),
                                                      batches=(1, 3)))
    assert report, report.to_markdown()  # CheckReport is true when every case passed
    labels = {(c.label, c.precision) for c in report.parity.cases}
    for p in ("fp32", "int8", "int4"):
        for res in ("24x40", "32x32"):
            assert {(f"{res} b1", p), (f"{res} b3", p)} <= labels
    assert all(c.provider == "cpu" for c in report.parity.cases)
    names = {(k.name, k.subject) for k in report.parity.checks}
    assert ("batch-independence", "cpu:int8") in names and ("determinism", "cpu:fp32") in names
    assert "coreml" in report.unavailable  # reported, not skipped
    md = report.to_markdown()
    assert "| 24x40 b3 | cpu | int8 |" in md and "coreml: not available" in md
    assert json.loads(report.to_json())["passed"] is True


def test_require_makes_an_unavailable_provider_fail(quantised_bundle, tmp_path):
    r = CliRunner().invoke(main, ["check", str(quantised_bundle), "--provider", "cpu,coreml",
                                  "--precision", "fp32", "--batch", "1", "--require",
                                  "--json", str(tmp_path / "c.json"),
                                  "--markdown", str(tmp_path / "c.md")])
    assert r.exit_code == 1 and "coreml: not available here (required)" in r.output
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["passed"] is False and data["unavailable"]["coreml"]
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


def test_bucket_graphs_are_checked_against_pytorch_at_their_own_size(quantised_bundle, tmp_path):
    """Each target's bucket graph is judged against PyTorch at its own size, every batch
    asked for, through the same session loop as the dynamic graph (check/sessions.py)."""
    from vit_deploy.targets.build import TargetOptions, add_target

    bundle = tmp_path / "b"
    shutil.copytree(quantised_bundle, bundle)
    add_target(bundle, TargetOptions(target="cpu", buckets=((16, 24),)))
    report = run_check(bundle, CheckOptions(reference="pytorch", precisions=("fp32", "int8"),
                                            batches=(1, 3)))
    assert report, report.to_markdown()
    buckets = [(c.provider, c.precision, c.resolution, c.batch) for c in report.parity.cases
               if "bucket" in c.provider]
    assert sorted(buckets) == [("cpu (bucket cpu)", p, (16, 24), b)
                               for p in ("fp32", "int8") for b in (1, 3)]
    assert report.engines and not report.unavailable


def test_an_embedding_bundle_reports_the_neighbours_each_precision_keeps(tmp_path, make_tiny):
    """check on a backbone: how many of each of the 50 judging photographs' 5 nearest
    neighbours fp16 keeps against fp32 on the CPU (all, or nearly: fp16 rounds little), and a
    session whose vectors are noise keeps few (the measure can fail)."""
    import numpy as np

    from vit_deploy.check.retrieval import RetrievalJudge
    from vit_deploy.precisions.add import add_precisions
    from vit_deploy.runtime.manifest import load_manifest

    out = tmp_path / "backbone"
    export_bundle(make_tiny(), out, options=ExportOptions(
        resolution=(32, 32), outputs=("pooled", "patch_tokens"), simplify=False))
    add_precisions(out, ["fp16"])
    r = CliRunner().invoke(main, ["check", str(out), "--reference", "bundle", "--json",
                                  str(tmp_path / "check.json")])
    assert r.exit_code == 0, r.output
    assert "neighbours kept (pooled: each of 50 photographs' 5 nearest" in r.output, r.output
    (found,) = json.loads((tmp_path / "check.json").read_text())["retrieval"]  # fp32 on the CPU is the reference itself
    assert (found["provider"], found["precision"], found["output"]) == ("cpu", "fp16", "pooled")
    assert found["photographs"] == 50 and found["k"] == 5 and found["mean"] >= 0.9, found
    assert found["worst_image"].startswith("eval-")

    class Noise:  # a session whose embedding is unrelated to the image
        def run_all(self, x):
            return {"pooled": np.random.default_rng(len(x)).normal(size=(len(x), 48))}

    noise = RetrievalJudge(out, load_manifest(out)).judge("cpu", "int8", Noise())
    assert noise.mean < 0.5, noise
