"""vit_deploy/bench/floor.py: the matrix work of a ViT (checked against published counts),
the floor arithmetic, and the GEMM peaks measured through ONNX Runtime."""

from __future__ import annotations

import pytest

from vit_deploy.bench.floor import (GemmPeak, ModelWork, floor_ms, measure_peak, model_work,
                                    peak_shape)
from vit_deploy.runtime.config import ViTConfig, variant
from vit_deploy.runtime.providers import import_openvino_quietly


def test_vit_b16_at_224_does_the_published_work():
    # timm's model table and fvcore: ViT-B/16 at 224, 17.6 GMACs (multiply-adds)
    work = model_work(variant("B", patch_size=16), (224, 224))
    assert work.total_gflop / 2 == pytest.approx(17.58, abs=0.05)
    # attention's products are a small part at 197 tokens and a large one at 785
    assert work.attention_gflop / work.total_gflop < 0.05
    big = model_work(variant("B", patch_size=16), (448, 448))
    assert big.attention_gflop / big.total_gflop > 0.12  # 14.5 %
    assert big.weights_gflop == pytest.approx(4 * work.weights_gflop, rel=0.02)


def test_work_follows_the_config():
    base = ViTConfig(img_size=(32, 32), patch_size=8, width=48, depth=2, heads=3,
                     num_classes=10)
    w = model_work(base, (32, 32))
    tokens, d, hidden = 17, 48, 192
    block = tokens * d * (4 * d + 2 * hidden)
    expected = 2 * (16 * 3 * 64 * d + 2 * block + d * 10)
    assert w.weights_gflop * 1e9 == pytest.approx(expected)
    assert w.attention_gflop * 1e9 == pytest.approx(2 * 2 * 2 * tokens * tokens * d)
    gated = model_work(base.replace(mlp="gated"), (32, 32))
    assert gated.weights_gflop * 1e9 == pytest.approx(expected + 2 * 2 * tokens * d * hidden)
    merged = model_work(base.replace(merge=(4, 4)), (32, 32))
    assert merged.attention_gflop * 1e9 == pytest.approx(2 * 2 * (17 * 17 + 13 * 13) * d)


def test_the_floor_uses_the_int8_peak_for_weights_only():
    peaks = {"fp32": GemmPeak("fp32", (1000, 1000, 500), 2, 1.0, 5),  # 1000 GFLOP/s
             "int8": GemmPeak("int8", (1000, 1000, 500), 2, 0.25, 5)}  # 4000
    assert peaks["fp32"].gflops == pytest.approx(1000)
    work = ModelWork(weights_gflop=8.0, attention_gflop=1.0)
    assert floor_ms(work, "fp32", peaks) == pytest.approx(9.0)
    assert floor_ms(work, "fp16", peaks) == pytest.approx(9.0)
    assert floor_ms(work, "int8", peaks) == pytest.approx(3.0)
    assert floor_ms(work, "int8-static", peaks, batch=4) == pytest.approx(12.0)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_a_peak_is_measured_through_onnx_runtime(kind):
    peak = measure_peak(kind, threads=1, shape=(64, 128, 256), min_seconds=0.01)
    assert peak.kind == kind and peak.runs >= 5 and peak.best_ms > 0
    assert 0.05 < peak.gflops < 10_000  # a real CPU, one thread
    assert peak.to_dict()["shape"] == [64, 128, 256]


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="expected one of fp32, int8, got 'int4'"):
        measure_peak("int4", threads=1)
    with pytest.raises(ValueError, match="threads: expected an integer >= 1, got 0"):
        measure_peak("fp32", threads=0)


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8"])
def test_openvino_measures_its_peak_and_names_the_kernel_that_ran(kind):
    from vit_deploy.bench.floor import measure_openvino_peak

    peak = measure_openvino_peak(kind, threads=1, shape=(64, 128, 256), min_seconds=0.01)
    assert peak.engine == "openvino" and peak.kind == kind and peak.gflops > 0
    # what this CPU ran, e.g. 'u8 brgemm_avx512_amx_I8' on AMX, 'f32 gemm_mlas_f32'
    precision, implementation = peak.kernel.split(" ", 1)
    assert implementation and precision == {"fp32": "f32", "int8": "u8"}.get(kind, precision)
    if kind == "bf16":  # bf16 on AMX / AVX-512 BF16 (emulated on other AVX-512), else f32
        assert precision in ("bf16", "f32"), peak.kernel
    assert peak.to_dict()["kernel"] == peak.kernel
    with pytest.raises(ValueError, match="OpenVINO peak kind: expected one of"):
        measure_openvino_peak("int4", threads=1)


def test_openvino_peaks_leave_out_bf16_where_the_cpu_lists_no_bf16(openvino_without_bf16):
    """On any CPU: the capability list made to lack BF16, the peaks are fp32 and int8 only
    (an emulated bf16 product is no peak: 160 ms against fp32's 5.5 ms on an AVX-512 Xeon
    without BF16)."""
    from vit_deploy.bench.floor import measure_openvino_peaks

    peaks = measure_openvino_peaks(threads=1, shape=(16, 32, 64), min_seconds=0.01)
    assert set(peaks) == {"openvino-fp32", "openvino-int8"}


def test_the_peak_has_the_models_mlp_shape():
    assert peak_shape(variant("B", patch_size=16), (448, 448)) == (785, 768, 3072)
    assert peak_shape(None, None) == (197, 768, 3072)


def test_bench_floor_reports_each_cpu_case_against_the_peaks_it_measured(quantised_bundle):
    from vit_deploy.bench.run import BenchOptions, run_bench
    from vit_deploy.bench.report import BenchReport
    from vit_deploy.runtime.manifest import load_manifest

    report = run_bench(quantised_bundle, BenchOptions(precisions=("fp32", "int8"), runs=3,
                                                      warmup=1, threads=(1,), floor=True))
    peaks = report.environment["gemm_peaks"]["1"]
    # ONNX Runtime's and OpenVINO's (the test extra installs it): the floor takes the better
    ov = import_openvino_quietly()  # as the product imports it: no usage event posted
    # bf16 only where the CPU lists it (OpenVINO emulates it elsewhere: not a peak)
    bf16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert set(peaks) == {"fp32", "int8", "openvino-fp32", "openvino-int8",
                          *(["openvino-bf16"] if bf16 else [])}
    assert all(p["gflops"] > 0 for p in peaks.values())
    assert {p["engine"] for p in peaks.values()} == {"onnxruntime", "openvino"}
    best = {k: max(peaks[k]["gflops"], peaks[f"openvino-{k}"]["gflops"]) for k in ("fp32", "int8")}
    cfg = load_manifest(quantised_bundle).config
    for case in report.cases:
        work = model_work(cfg, case.resolution)
        weight = best["int8" if case.precision == "int8" else "fp32"]
        expected = (work.weights_gflop / weight + work.attention_gflop / best["fp32"])
        assert case.floor_ms == pytest.approx(expected * 1e3, rel=0.01)  # peaks are rounded
        assert case.of_floor() == pytest.approx(case.floor_ms / case.stats()["p50_ms"])
    saved = BenchReport.from_json(report.to_json())
    assert [c.floor_ms for c in saved.cases] == [c.floor_ms for c in report.cases]
    assert all(c["of_floor"] == pytest.approx(case.of_floor()) for c, case in
               zip(report.to_dict()["cases"], report.cases))


def test_without_floor_nothing_is_measured(quantised_bundle):
    from vit_deploy.bench.run import BenchOptions, run_bench

    report = run_bench(quantised_bundle, BenchOptions(runs=2, warmup=0, threads=(1,)))
    assert "gemm_peaks" not in report.environment
    assert all(c.floor_ms is None and c.of_floor() is None for c in report.cases)


def test_the_budget_recommends_the_largest_size_that_fits_then_the_fastest():
    from vit_deploy.bench.report import BenchReport, CaseResult, budget_lines, recommend

    def case(provider, precision, hw, ms):
        return CaseResult(provider=provider, requested=provider, precision=precision,
                          resolution=hw, batch=1, threads=2, latencies_ms=[ms] * 5)

    report = BenchReport("b", {}, {}, [
        case("cpu", "fp32", (224, 224), 90.0), case("cpu", "fp32", (448, 448), 400.0),
        case("cpu", "int8", (224, 224), 40.0), case("cpu", "int8", (448, 448), 140.0),
        case("openvino", "int8", (224, 224), 35.0), case("openvino", "int8", (448, 448), 120.0)])
    assert recommend(report, 150) == {"provider": "openvino", "precision": "int8",
                                      "float_precision": "f32", "resolution": [448, 448],
                                      "p90_ms": 120.0, "budget_ms": 150}
    assert recommend(report, 100)["resolution"] == [224, 224]
    assert recommend(report, 100)["provider"] == "openvino"  # 35 ms beats 40 and 90
    assert recommend(report, 10) is None
    assert budget_lines(report, 10)[-1] == "recommended within 10 ms: nothing measured fits"
    assert report.to_dict()["cases"]  # and saved beside the budget:
    report.budget_ms = 150
    assert report.to_dict()["recommended"]["provider"] == "openvino"
