"""Golden references: the generator both runtimes share, what export and target store,
`check` without torch against them (it passes, and it fails on a tampered model), old
bundles without references, the size bound, and --compare over reports of three runtimes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.data import data_path
from vit_deploy.export.references import REFERENCE_PHOTOS
from vit_deploy.runtime.preprocess import Preprocess
from vit_deploy.runtime.contract import COSINE_MIN, MODEL_FILE
from vit_deploy.runtime.manifest import Manifest, load_manifest
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.references import (GENERATOR, MAX_FRACTION, REFERENCES_FILE,
                                           iter_references, mulberry32_uniform)

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "data" / "mulberry32.json"
# Blocks torch the way a target machine lacks it: "import torch" raises ImportError.
NO_TORCH = "import sys\nfor _n in ('torch', 'torchvision'):\n    sys.modules[_n] = None\n"
SCHEMA_CASE_KEYS = {"label", "provider", "precision", "resolution", "batch", "output", "max_abs",
                    "abs_tol", "cosine", "cosine_min", "passed"}


def mulberry32_table() -> dict:
    """The shared fixture (tests/data/mulberry32.json): seed 1, shape [8], the float32
    values and their little-endian bytes; the JavaScript tests assert the same bytes."""
    x = mulberry32_uniform(1, [8])
    return {"generator": GENERATOR, "seed": 1, "shape": [8], "values": x.tolist(),
            "float32_le_hex": x.astype("<f4").tobytes().hex()}


def write_mulberry32_table() -> None:  # python -c "from tests.test_references import *; w..."
    TABLE.write_text(json.dumps(mulberry32_table(), indent=2) + "\n")


def test_generator_matches_the_shared_table():
    assert json.loads(TABLE.read_text()) == mulberry32_table()
    # mulberry32's own first output for seed 1 (the published JS function), mapped to [-2, 2)
    assert mulberry32_table()["values"][0] == np.float32(0.5082957744598389)
    x = mulberry32_uniform(7, (2, 3, 4, 5))
    assert x.dtype == np.float32 and x.shape == (2, 3, 4, 5)
    assert x.min() >= -2 and x.max() < 2 and abs(float(x.mean())) < 0.3
    assert np.array_equal(x.reshape(-1)[:8], mulberry32_uniform(7, [8]))  # C order, counter-based


def test_export_stores_pytorch_outputs_for_every_declared_output(tiny_bundle, torch_logits):
    model, result = tiny_bundle
    manifest = load_manifest(result.path)
    refs = manifest.references
    assert refs is not None and refs.file == REFERENCES_FILE and refs.generator == GENERATOR
    assert refs.source.startswith("pytorch fp32 (torch ")
    assert manifest.files[REFERENCES_FILE].role == "references"
    assert [(c.name, c.resolution, c.batch) for c in refs.cases] == [
        ("deploy", (48, 64), 2), ("native", (32, 32), 2), ("non-square", (32, 24), 2),
        ("photos", (48, 64), 2)]
    assert [c.pixels is not None for c in refs.cases] == [False, False, False, True]
    seen = 0
    for case, x, outputs in iter_references(result.path / refs.file, refs):
        assert set(outputs) == set(manifest.io.output_names)
        np.testing.assert_allclose(outputs["logits"], torch_logits(model, x), rtol=0, atol=1e-6)
        if case.pixels is not None:  # two shipped photographs, made input as the runtime does
            pre = Preprocess.from_manifest(manifest, resize="shorter_side_center_crop")
            expected = np.stack([pre(data_path(f"photos/{n}")) for n in REFERENCE_PHOTOS])
            assert np.array_equal(x, expected)  # bit for bit
        seen += 1
    assert seen == 4
    size = manifest.files[REFERENCES_FILE].size
    assert refs.nbytes <= MAX_FRACTION * manifest.files[MODEL_FILE].size
    assert size == refs.file_bytes == refs.nbytes + 2 * 3 * 48 * 64
    again = Manifest.from_json(manifest.to_json())
    assert again.references == refs


def _shim(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "no-torch"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(NO_TORCH)
    return {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{ROOT}"}


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vit_deploy.cli", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT)


def _assert_schema(data: dict, kind: str) -> None:
    assert data["schema"] == "vit-deploy-report" and data["schema_version"] == 1
    assert data["kind"] == kind and isinstance(data["passed"], bool)
    assert set(data["device"]) == {"runtime", "platform", "cpu", "gpu"}
    assert data["device"]["runtime"].startswith("onnxruntime ")
    assert isinstance(data["reference"], str) and isinstance(data["latency"], list)
    if kind == "check":
        assert all(SCHEMA_CASE_KEYS <= set(c) for c in data["cases"])


def test_check_without_torch_uses_the_references(quantised_bundle, tmp_path):
    env = _shim(tmp_path)
    assert _cli(["--help"], env).returncode == 0
    blocked = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True)
    assert blocked.returncode != 0  # really no torch in there
    out = tmp_path / "check.json"
    r = _cli(["check", str(quantised_bundle), "--precision", "fp32,int8", "--json", str(out)],
             env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vs golden references (pytorch fp32, torch" in " ".join(r.stdout.split())
    data = json.loads(out.read_text())
    _assert_schema(data, "check")
    assert data["passed"] is True and data["reference"].startswith("golden references")
    cases = {(c["precision"], c["label"]) for c in data["cases"]}
    assert cases == {(p, label) for p in ("fp32", "int8")
                     for label in ("24x40 b2", "32x32 b2", "32x24 b2", "24x40 b2 photos")}
    assert min(c["cosine"] for c in data["cases"] if c["precision"] == "int8") >= COSINE_MIN["int8"]


def _tamper(bundle: Path, to: Path) -> Path:
    """A copy of `bundle` whose fp32 model has one weight matrix scaled by 1.05, with the
    manifest's hash updated: it verifies, but computes something else."""
    shutil.copytree(bundle, to)
    model = onnx.load(str(to / MODEL_FILE))
    init = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    array = onnx.numpy_helper.to_array(init) * np.float32(1.05)
    init.CopyFrom(onnx.numpy_helper.from_array(array, init.name))
    onnx.save(model, str(to / MODEL_FILE))
    data = (to / MODEL_FILE).read_bytes()
    m = json.loads((to / "manifest.json").read_text())
    m["files"][MODEL_FILE] |= {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (to / "manifest.json").write_text(json.dumps(m))
    return to


def test_check_without_torch_fails_a_tampered_model(quantised_bundle, tmp_path):
    bad = _tamper(quantised_bundle, tmp_path / "tampered")
    r = _cli(["check", str(bad), "--precision", "fp32,int8", "--markdown",
              str(tmp_path / "c.md")], _shim(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    md = (tmp_path / "c.md").read_text()
    assert "Result: **FAIL**" in md and "golden references" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and " b2 " in line]
    assert all(("**FAIL**" in row) == ("| fp32 |" in row) for row in rows)  # int8 untouched


def _strip_references(bundle: Path, to: Path) -> Path:
    """`bundle` as it was before references existed."""
    shutil.copytree(bundle, to)
    (to / REFERENCES_FILE).unlink()
    m = json.loads((to / "manifest.json").read_text())
    del m["references"], m["files"][REFERENCES_FILE]
    (to / "manifest.json").write_text(json.dumps(m))
    return to


def test_an_old_bundle_without_references(quantised_bundle, tmp_path):
    old = _strip_references(quantised_bundle, tmp_path / "old")
    assert load_manifest(old).references is None
    r = _cli(["check", str(old), "--precision", "fp32"], _shim(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    text = " ".join((r.stdout + r.stderr).split())
    assert "has no golden references" in text and "check needs PyTorch" in text
    r = CliRunner().invoke(main, ["check", str(old), "--precision", "fp32", "--batch", "1"])
    assert r.exit_code == 0 and "rebuilt from the bundle's weights" in r.output, r.output
    r = CliRunner().invoke(main, ["check", str(old), "--reference", "bundle"])
    assert r.exit_code == 2 and "has no golden references" in r.output


@pytest.mark.parametrize("change,message", [
    (lambda m: m["references"]["cases"][0]["outputs"]["logits"].update(offset=10**6),
     "inside the"),
    (lambda m: m["references"]["cases"][0]["outputs"].update(nope={"offset": 0, "shape": [2]}),
     "outputs the bundle declares"),
    (lambda m: m["references"].update(file="model.onnx"), "role 'references'"),
    (lambda m: m["references"]["cases"][0].update(shape=[2, 3, 0, 40]), "shape: \\[batch"),
    # an output of no dimensions was an IndexError (a traceback), not a manifest error
    (lambda m: m["references"]["cases"][0]["outputs"]["logits"].update(shape=[]),
     "outputs the bundle declares"),
], ids=["offset", "output", "file", "shape", "scalar output"])
def test_the_manifest_refuses_bad_references(quantised_bundle, change, message):
    m = json.loads((quantised_bundle / "manifest.json").read_text())
    change(m)
    with pytest.raises(BundleError, match=message):
        Manifest.from_dict(m)


def test_the_size_bound_leaves_out_cases_that_do_not_fit():
    from vit_deploy.export.references import golden_references

    def forward(x):  # a dense output: (B, 48, H/8, W/8)
        return {"patch_tokens": np.zeros((len(x), 48, x.shape[2] // 8, x.shape[3] // 8),
                                         np.float32)}

    sizes = [("deploy", (64, 64)), ("native", (32, 32)), ("non-square", (128, 96))]
    one = 2 * 48 * 8 * 8 * 4  # bytes of the deploy case
    cases, notes = golden_references(forward, sizes, channels=3, output_names=["patch_tokens"],
                                     budget_bytes=one + one // 4 + 10)
    assert [c.name for c, _ in cases] == ["deploy", "native"]
    assert len(notes) == 1 and "non-square" in notes[0] and "5%" in notes[0]


def test_target_buckets_get_references_at_their_sizes(quantised_bundle, tmp_path):
    from vit_deploy.check.run import CheckOptions, run_check
    from vit_deploy.targets.build import TargetOptions, add_target

    bundle = tmp_path / "b"
    shutil.copytree(quantised_bundle, bundle)
    before = load_manifest(bundle).references
    add_target(bundle, TargetOptions(target="cpu", buckets=((16, 24), (32, 32))))
    refs = load_manifest(bundle).references
    assert refs.cases[:len(before.cases)] == before.cases  # the export's cases unchanged
    added = [(c.name, c.target, c.resolution) for c in refs.cases[len(before.cases):]]
    assert added == [("cpu 16x24", "cpu", (16, 24)), ("cpu 32x32", "cpu", (32, 32))]
    add_target(bundle, TargetOptions(target="cpu", buckets=((24, 24),)))  # replaces its cases
    manifest = load_manifest(bundle)
    assert [c.name for c in manifest.references.cases if c.target] == ["cpu 24x24"]
    assert manifest.files[REFERENCES_FILE].size == manifest.references.file_bytes
    photos = [c for c in manifest.references.cases if c.pixels is not None]
    assert [c.name for c in photos] == ["photos"] and photos == [
        c for c in before.cases if c.pixels is not None]  # kept, pixels and all
    report = run_check(bundle, CheckOptions(reference="bundle", precisions=("fp32", "int8")))
    assert report, report.to_markdown()
    buckets = {(c.provider, c.precision, c.resolution) for c in report.parity.cases
               if "bucket" in c.provider}
    assert buckets == {("cpu (bucket cpu)", p, (24, 24)) for p in ("fp32", "int8")}


# -- one schema, every runtime: --compare ----------------------------------------------
def _hand_written(runtime: str, platform: str, provider_cosines: dict, latency: dict) -> dict:
    """A report as Node's vit.check() or the page's download writes it (the shared
    schema, written here by hand from the spec)."""
    cases = [{"label": "24x40 b2", "provider": p, "precision": prec, "resolution": [24, 40],
              "batch": 2, "output": "logits", "max_abs": 1e-7, "abs_tol": 1e-4 if prec == "fp32"
              else None, "cosine": cos, "cosine_min": COSINE_MIN[prec],
              "passed": cos >= COSINE_MIN[prec]} for (p, prec), cos in provider_cosines.items()]
    lat = [{"provider": p, "precision": prec, "resolution": [24, 40], "batch": 2,
            "p50_ms": p50, "p90_ms": p50 * 1.25, "runs": 20} for (p, prec), p50 in latency.items()]
    return {"schema": "vit-deploy-report", "schema_version": 1, "kind": "check",
            "bundle": "tiny", "device": {"runtime": runtime, "platform": platform,
                                         "cpu": None, "gpu": None},
            "reference": "golden references (pytorch fp32, torch 2.13.0)",
            "passed": all(c["passed"] for c in cases), "cases": cases, "latency": lat}


def test_compare_lays_out_reports_of_three_runtimes(quantised_bundle, tmp_path):
    python = tmp_path / "python-x86.json"
    r = CliRunner().invoke(main, ["check", str(quantised_bundle), "--reference", "bundle",
                                  "--precision", "fp32,int8", "--json", str(python)])
    assert r.exit_code == 0, r.output
    node, page = tmp_path / "node.json", tmp_path / "chromium.json"
    node.write_text(json.dumps(_hand_written(
        "onnxruntime-node 1.30.0", "linux x64, node v22", {("cpu", "fp32"): 0.99999999,
                                                           ("cpu", "int8"): 0.9996},
        {("cpu", "fp32"): 0.8, ("cpu", "int8"): 0.5})))
    page.write_text(json.dumps(_hand_written(
        "onnxruntime-web 1.30.0", "Chromium 131 (headless), Linux x86_64",
        {("wasm", "fp32"): 0.99999998, ("webgpu", "fp32"): 0.9990},  # webgpu fails fp32
        {("wasm", "fp32"): 3.1, ("webgpu", "fp32"): 12000.0})))
    r = CliRunner().invoke(main, ["bench", "--compare", str(python), str(node), str(page)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "onnxruntime-node 1.30.0" in text and "onnxruntime-web 1.30.0" in text
    assert "(python)" in text and "chromium: unknown CPU" in text
    assert "check PASS" in text and "check FAIL" in text  # per report, above the table
    rows: list[list[str]] = []
    for line in r.output.splitlines():
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.split("│")[1:-1]]
            if cells[0] or not rows:
                rows.append(cells)
            else:  # a cell wrapped onto the next line
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]

    def row(provider: str, precision: str) -> list[str]:  # the 24x40 b2 row: one cell a report
        return next(cells[5:] for cells in rows if cells[:4] == [provider, precision, "24x40",
                                                                   "2"])

    python_cell, node_cell, page_cell = row("cpu", "fp32")  # side by side, in order given
    assert python_cell == "pass cos 1.000000 (cpu)" and page_cell == "-"  # parity, no latency
    assert node_cell == "0.80 / 1.00 (cpu), pass cos 1.000000"  # latency and parity
    assert row("cpu", "int8")[1] == "0.50 / 0.62 (cpu), pass cos 0.999600"
    assert row("cpu", "int8")[0].startswith("pass cos 0.99")
    assert row("wasm", "fp32") == ["-", "-", "3.10 / 3.88 (wasm), pass cos 1.000000"]
    assert row("webgpu", "fp32")[2] == "12000.00 / 15000.00 (webgpu), FAIL 1/1 cos 0.999000"


def test_compare_numbers_columns_whose_names_a_narrow_table_cuts(tmp_path):
    """Real reports of one runtime differ only at the end of their names (the page's wasm
    and webgpu reports, fp32 and int8): in 80 columns each header still starts with its
    [n], the line above the table that names it in full; the cell legend is said once."""
    names = ["chromium-wasm-fp32", "chromium-wasm-int8", "chromium-webgpu-fp32",
             "chromium-webgpu-int8"]
    paths = []
    for name in names:
        backend, precision = name.split("-")[1:]
        cosines = {(b, precision): 0.9999999 for b in {backend, "wasm"}}
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(_hand_written(
            "onnxruntime-web 1.30.0", "HeadlessChrome/156, Linux x86_64", cosines,
            {k: 2.0 for k in cosines})))
    r = CliRunner().invoke(main, ["bench", "--compare", *map(str, paths)],
                           env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    for i, name in enumerate(names, 1):
        assert any(line.startswith(f"[{i}] {name}: unknown CPU") for line in lines), r.output
    header = next(line for line in lines if "[1]" in line and line.startswith("┃"))
    assert [f"[{i}]" in header for i in range(1, 5)] == [True] * 4, header
    assert "p50 / p90 ms" not in header
    assert sum("each cell: p50 / p90 ms" in line for line in lines) == 1


def test_gpu_check_proves_with_the_references_without_torch(quantised_bundle, tmp_path):
    """make gpu-check's steps on the CPU (PROVIDERS=cpu), torch blocked: the golden check
    runs and passes, the PyTorch check is skipped, the bench report has the schema."""
    env = _shim(tmp_path) | {"BIN": str(Path(sys.executable).parent), "BUNDLE":
                             str(quantised_bundle), "PROVIDERS": "cpu", "RES": "24x40",
                             "BENCH_BATCH": "1", "RUNS": "2"}
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], env=env,
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    golden = json.loads((out / "check-golden-cpu.json").read_text())
    _assert_schema(golden, "check")
    assert golden["passed"] is True and golden["reference"].startswith("golden references")
    assert {c["precision"] for c in golden["cases"]} == {"fp32"}  # fp16 / int8-static absent
    assert not (out / "check-cpu.json").exists()  # no torch: no PyTorch check
    bench = json.loads((out / "bench.json").read_text())
    _assert_schema(bench, "bench")
    assert [(t["provider"], t["resolution"]) for t in bench["latency"]] == [("cpu", [24, 40])]


def _edited(bundle: Path, to: Path, change) -> Path:
    shutil.copytree(bundle, to)
    m = json.loads((to / "manifest.json").read_text())
    change(m)
    (to / "manifest.json").write_text(json.dumps(m))
    return to


def _retarget(m, name):
    m["references"]["cases"][0]["target"] = name


@pytest.mark.parametrize("change,message", [
    (lambda m: [c.update(target="phone") for c in m["references"]["cases"]],
     "name target(s) ['phone'] that it does not have"),
    (lambda m: _retarget(m, "npu"), "name target(s) ['npu'] that it does not have"),
    (lambda m: m["references"].update(cases=[]), "golden references with no cases"),
    (lambda m: m["references"]["cases"][0].update(shape=[2, 3, 4096, 4096]), "attention needs about"),
    (lambda m: m["references"]["cases"][0].update(shape=[2, 3, 2048, 4096]), "attention needs about"),
], ids=["every case a missing target", "one case a missing target", "no cases",
        "4096x4096 declared", "2048x4096 declared"])
def test_check_on_references_that_compare_nothing_or_too_much_fails_clearly(
        quantised_bundle, tmp_path, change, message):
    """A check that compared nothing has not passed; a declared reference size is guarded
    before its input is built (seconds, not a 3 GB allocation)."""
    bundle = _edited(quantised_bundle, tmp_path / "b", change)
    r = CliRunner().invoke(main, ["check", str(bundle), "--reference", "bundle", "--quiet"])
    assert r.exit_code != 0, r.output
    assert message in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("shape", [[2, 2**62], [2, 2**40, 2**40], [2, 10**30]])
def test_an_output_shape_that_overflows_is_a_manifest_error(quantised_bundle, shape):
    m = json.loads((quantised_bundle / "manifest.json").read_text())
    m["references"]["cases"][0]["outputs"]["logits"]["shape"] = shape
    with pytest.raises(BundleError, match="inside the"):
        Manifest.from_dict(m)


def test_a_check_on_a_provider_that_never_runs_here_has_not_passed(quantised_bundle):
    """CoreML exists on no Linux machine: nothing is compared, so nothing passed."""
    r = CliRunner().invoke(main, ["check", str(quantised_bundle), "--reference", "bundle",
                                  "--provider", "coreml", "--precision", "fp32"])
    assert r.exit_code == 1, r.output
    assert "no case was compared" in " ".join(r.output.split()) and "FAIL" in r.output


def test_the_photograph_case_keeps_one_photograph_rather_than_none():
    """Where both reference photographs' outputs would pass the bound, one is stored (and
    said); where not even one fits, the note gives what the references already hold."""
    from vit_deploy.export.references import photo_reference
    from vit_deploy.runtime.manifest_parts import PreprocessSpec

    spec = PreprocessSpec(resolution=(32, 32), mean=(0.5,) * 3, std=(0.5,) * 3)

    def forward(x):  # 1,000 float32 per image: 4,000 bytes each
        return {"pooled": np.zeros((len(x), 1000), np.float32)}

    def case(budget, used):
        return photo_reference(forward, (32, 32), spec, patch_size=16, channels=3,
                               output_names=["pooled"], budget_bytes=budget, used_bytes=used)

    cases, pixels, notes = case(100_000, 90_000)  # room for 2 x 4,000
    assert cases[0][0].shape[0] == 2 and not notes
    cases, pixels, notes = case(100_000, 95_000)  # room for one
    assert cases[0][0].shape[0] == 1 and pixels["photos"].shape[0] == 1
    assert "holds 1 of the 2 photographs" in notes[0] and "103000 bytes" in notes[0]
    cases, pixels, notes = case(100_000, 97_000)  # room for none
    assert cases == [] and "already hold 97000 bytes" in notes[0], notes
