import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from vit_deploy.bench.run import BenchOptions, run_bench
from vit_deploy.reports.machine import environment
from vit_deploy.cli import main


def test_bench_interleaves_cases_and_times_the_torch_baseline_alone(tiny_bundle):
    """ONNX Runtime cases interleave in this process; the PyTorch baseline runs alone in a
    fresh process (another pid, the threads asked for), with the same runs."""
    _, result = tiny_bundle
    report = run_bench(result.path, BenchOptions(resolutions=((16, 16), (32, 48)), batches=(1, 2),
                                                 threads=(1,), runs=6, warmup=1, sessions=2,
                                                 baseline_torch=True))
    assert len(report.cases) == 2 * 2 * 2  # (torch + cpu fp32) x resolutions x batches
    for case in report.cases:
        s = case.stats()
        assert case.status.startswith("ok") and s["runs"] == 6
        assert s["min_ms"] <= s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
        assert s["images_per_s"] > 0
        assert case.cold_start_ms > 0
        if case.provider == "torch":
            assert case.ratio_to_torch is None
            assert case.status == "ok: timed alone in its own process"
        else:
            assert case.provider == "cpu" and case.ratio_to_torch > 0
            assert len(case.session_medians_ms) == 2  # every session was used
    assert report.to_dict()["passed"] is True


def test_the_torch_baseline_process_is_another_process_with_the_threads_asked(tiny_bundle):
    import os
    import subprocess
    import sys

    _, result = tiny_bundle
    r = subprocess.run([sys.executable, "-m", "vit_deploy.bench.pytorch", str(result.path), "16",
                        "16", "1", "1", "0", "3", "none"], capture_output=True, text=True)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "ok" and out["threads"] == 1 and out["pid"] != os.getpid()
    assert len(out["latencies_ms"]) == 3


def test_case_statistics_from_known_latencies():
    """Ten runs of 10..100 ms at batch 4, worked out by hand (numpy's linear percentiles)."""
    from vit_deploy.bench.report import CaseResult

    case = CaseResult("cpu", "cpu", "fp32", (32, 32), 4, 2,
                      latencies_ms=[10.0 * k for k in range(10, 0, -1)])
    assert case.stats() == pytest.approx({"p50_ms": 55.0, "p90_ms": 91.0, "p99_ms": 99.1,
                                          "mean_ms": 55.0, "min_ms": 10.0, "max_ms": 100.0,
                                          "runs": 10, "images_per_s": 4 / 0.055})


def test_another_float_precision_is_recommended_only_where_judged_and_passed():
    from vit_deploy.bench.report import BenchReport, CaseResult, recommend

    def report(judged):
        f32 = CaseResult("openvino", "openvino", "int8-static", (224, 224), 1, 2,
                         latencies_ms=[30.0] * 3)
        bf16 = CaseResult("openvino", "openvino", "int8-static", (224, 224), 1, 2,
                          latencies_ms=[20.0] * 3, float_precision="bf16", judged=judged)
        return BenchReport("b", {}, {}, [f32, bf16])

    faster = recommend(report({"passed": True}), 100.0)
    assert (faster["float_precision"], faster["p90_ms"]) == ("bf16", 20.0)
    for judged in (None, {"passed": False}):  # not judged, or outside the policy
        assert recommend(report(judged), 100.0)["float_precision"] == "f32"
    back = BenchReport.from_json(report({"passed": True, "cosine_min": 0.997}).to_json())
    assert back.cases[1].configuration == "int8-static +bf16"
    assert back.cases[1].judged == {"passed": True, "cosine_min": 0.997}


def test_thread_scaling_is_the_best_one_thread_time_over_the_best_n_thread_time():
    """A scripted clock: one thread's runs take 4, 3, 5 s, two threads' 2, 1.5, 3 s."""
    from vit_deploy.reports.machine import thread_scaling

    ticks, now = [], 0.0
    for took in (4, 3, 5, 2, 1.5, 3):
        ticks += [now, now + took]
        now += 10
    clock = iter(ticks).__next__
    assert thread_scaling(2, size=64, repeats=3, clock=clock) == 3 / 1.5


def test_unavailable_provider_is_reported_not_skipped(tiny_bundle):
    _, result = tiny_bundle
    report = run_bench(result.path, BenchOptions(providers=("cpu", "coreml"), runs=2, warmup=0,
                                                 sessions=1))
    by = {c.requested: c for c in report.cases}
    assert by["coreml"].status.startswith("unavailable") and not by["coreml"].latencies_ms
    assert by["cpu"].status == "ok"


def test_environment_fingerprint():
    env = environment()
    assert env["cores"] >= 1 and env["onnxruntime"] and "cpu" in env
    assert "CPUExecutionProvider" in env["ort_providers_listed"]


def test_bench_cli_writes_json_and_csv_and_compares(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    j, c = tmp_path / "r.json", tmp_path / "r.csv"
    r = CliRunner().invoke(main, ["bench", str(result.path), "--res", "16,24x32", "--runs", "3",
                                  "--warmup", "0", "--sessions", "1", "--json", str(j),
                                  "--csv", str(c), "--threads", "1,default"])
    assert r.exit_code == 0, r.output
    data = json.loads(j.read_text())
    assert len(data["cases"]) == 4 and data["environment"]["cores"] >= 1
    rows = list(csv.DictReader(io.StringIO(c.read_text())))
    assert {row["resolution"] for row in rows} == {"16x16", "24x32"}
    assert {row["threads"] for row in rows} == {"1", ""}
    r = CliRunner().invoke(main, ["bench", "--compare", str(j), "--compare", str(j)])
    assert r.exit_code == 0 and r.output.count("(cpu)") == 8


@pytest.mark.parametrize("args,message", [
    (["--res", "20"], "not a positive multiple of the patch size 8"),
    (["--precision", "int8"], "no 'int8' model"),
    (["--batch", "0"], "batch sizes must be positive"),
    (["--threads", "x"], "threads must be positive"),
])
def test_bench_bad_arguments(tiny_bundle, args, message):
    _, result = tiny_bundle
    r = CliRunner().invoke(main, ["bench", str(result.path), *args])
    assert r.exit_code == 2 and message in r.output, r.output


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


def test_report_says_how_many_cores_the_threads_got(tiny_bundle):
    from vit_deploy.reports.machine import thread_scaling
    from vit_deploy.bench.report import BenchReport, status_notes

    _, result = tiny_bundle
    report = run_bench(result.path, BenchOptions(threads=(2,), runs=2, warmup=0, sessions=1))
    probe = report.environment["thread_scaling"]
    assert probe["threads"] == 2 and probe["before"] > 0 and probe["after"] > 0
    one = run_bench(result.path, BenchOptions(threads=(1,), runs=2, warmup=0, sessions=1))
    assert "thread_scaling" not in one.environment  # nothing to probe on one thread
    assert thread_scaling(1, size=64, repeats=2) > 0  # runs on the real matmul
    starved = BenchReport(report.bundle, report.environment | {"thread_scaling": {
        "threads": 2, "before": 0.93, "after": 1.95}}, report.options, report.cases)
    assert any("2 threads got 0.93 (before)" in n for n in status_notes(starved))
    fed = BenchReport(report.bundle, report.environment | {"thread_scaling": {
        "threads": 2, "before": 1.9, "after": 1.95}}, report.options, report.cases)
    assert not any("cores' worth" in n for n in status_notes(fed))


# -- saved reports: BenchReport.from_json, and --compare over several machines ------------
@pytest.fixture(scope="module")
def saved_report(tiny_bundle, tmp_path_factory):
    _, result = tiny_bundle
    path = tmp_path_factory.mktemp("reports") / "here.json"
    r = CliRunner().invoke(main, ["bench", str(result.path), "--res", "16,24x32", "--runs", "3",
                                  "--warmup", "0", "--sessions", "1", "--json", str(path),
                                  "--budget-ms", "10000"])
    assert r.exit_code == 0, r.output
    return path


def test_a_saved_report_reads_back_typed_and_unchanged(saved_report):
    from vit_deploy.bench.report import BenchReport

    data = json.loads(saved_report.read_text())
    report = BenchReport.from_json(saved_report.read_text())
    assert report.to_dict() == data  # budget included
    assert report.budget_ms == 10000 and report.cases[1].resolution == (24, 32)
    assert report.cases[0].stats()["p90_ms"] == data["cases"][0]["p90_ms"]


def _machine(data: dict, cpu: str, provider: str, scale: float) -> dict:
    """The same cases as measured on another machine: its CPU, its provider, its speed."""
    data = json.loads(json.dumps(data))
    data["environment"] |= {"cpu": cpu, "gpu": "NVIDIA H200" if provider == "cuda" else None}
    for c in data["cases"]:
        c["provider"] = provider
        c["p50_ms"], c["p90_ms"] = c["p50_ms"] * scale, c["p90_ms"] * scale
    return data


@pytest.mark.parametrize("form", ["variadic", "repeated"])
def test_compare_lays_three_machines_side_by_side(saved_report, tmp_path, form):
    data = json.loads(saved_report.read_text())
    paths = [tmp_path / "xeon.json", tmp_path / "epyc.json", tmp_path / "h200.json"]
    machines = [("Intel Xeon Platinum 8480", "cpu", 1.0), ("AMD EPYC 9654", "cpu", 2.0),
                ("AMD EPYC 7B13", "cuda", 0.5)]
    for path, (cpu, provider, scale) in zip(paths, machines):
        path.write_text(json.dumps(_machine(data, cpu, provider, scale)))
    args = ([str(p) for p in paths] if form == "variadic"
            else ["--compare", str(paths[0]), str(paths[1]), "--compare", str(paths[2])])
    r = CliRunner().invoke(main, ["bench", "--compare", *args])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    for path, (cpu, _, _) in zip(paths, machines):
        assert f"{path.stem}: {cpu}" in text  # each report says where it ran
    assert "NVIDIA H200" in text  # the GPU heads its column
    for case in data["cases"]:  # one row per case, p50 / p90 (ran on) per report
        res = "x".join(map(str, case["resolution"]))
        row = next(line for line in r.output.splitlines() if f" {res} " in line)
        cells = [f"{case['p50_ms'] * s:.2f} / {case['p90_ms'] * s:.2f} ({p})"
                 for _, p, s in machines]
        assert all(cell in row for cell in cells), (row, cells)
        assert row.index(cells[0]) < row.index(cells[1]) < row.index(cells[2])


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"),  # refused as the command line is parsed
    ("not json", "not JSON"),
    ("[]", "the file must be a JSON object"),
    ('{"cases": {}}', "'cases' must be a list"),
    ('{"cases": [{"provider": "cpu", "requested": "cpu", "precision": "fp32", "status": "ok", '
     '"resolution": [16], "batch": 1, "threads": null}]}',
     "case 1 'resolution' must be [height, width]"),
    ('{"cases": [{"provider": "cpu", "requested": "cpu", "precision": "fp32", "status": "ok", '
     '"resolution": [16, 16], "batch": 1, "threads": null, "p50_ms": "fast"}]}',
     "case 1 'p50_ms' must be a number or null"),
], ids=["missing", "not-json", "array", "cases", "resolution", "p50"])
def test_compare_refuses_what_is_not_a_report(saved_report, tmp_path, content, message):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    r = CliRunner().invoke(main, ["bench", "--compare", str(saved_report), str(bad)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "bad.json" in r.output and message in " ".join(r.output.split()), r.output


def test_bench_wants_one_bundle_or_compare(saved_report, tiny_bundle):
    _, result = tiny_bundle
    r = CliRunner().invoke(main, ["bench", str(result.path), str(saved_report)])
    assert r.exit_code == 2 and "add --compare" in r.output
    r = CliRunner().invoke(main, ["bench", "--compare"])
    assert r.exit_code == 2 and "--compare needs the saved reports" in r.output
