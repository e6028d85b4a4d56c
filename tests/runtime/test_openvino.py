"""OpenVINO as an engine of the runtime (runtime/ov_session.py): the same bundle files,
outputs and checks as ONNX Runtime, strict selection, and `check` / `bench` / `predict`
across engines. The selection errors need no OpenVINO (its import is made to fail); the
rest needs the openvino package, which the test extra installs (never skipped: a missing
install fails here)."""

import importlib.util
import json
import shutil
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from click.testing import CliRunner

from vit_deploy.bench.run import BenchOptions, run_bench
from vit_deploy.check.run import CheckOptions, run_check
from vit_deploy.cli import main
from vit_deploy.parity import compare, sample_inputs
from vit_deploy.runtime import ProviderError, RuntimeOptions, ViTSession, parse_providers, probe
from vit_deploy.runtime.providers import import_openvino_quietly, probe_all

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
needs_openvino = pytest.mark.usefixtures("_openvino_installed")


@pytest.fixture
def _openvino_installed():
    assert HAS_OPENVINO, "the openvino package is not installed: make test installs it (the test extra)"
PHOTO = "vit_deploy/data/photos/eval-chelsea.jpg"
SIZES = [(24, 40), (32, 16)]  # the deploy size and another grid (dynamic height and width)
BATCHES = [1, 3]


@pytest.fixture(scope="module")
def bundle(quantised_bundle, tmp_path_factory):
    """The tiny quantised bundle (fp32, int8 dynamic, int4) plus int8-static (QDQ)."""
    from vit_deploy.precisions.add import add_precisions

    out = tmp_path_factory.mktemp("openvino") / "b"
    shutil.copytree(quantised_bundle, out)
    add_precisions(out, ["int8-static"])
    return out


@pytest.fixture
def no_openvino(monkeypatch):
    """`import openvino` fails, as where it is not installed."""
    monkeypatch.setitem(sys.modules, "openvino", None)


# -- the same outputs as ONNX Runtime -----------------------------------------------------
@needs_openvino
@pytest.mark.parametrize("precision", ["fp32", "int8", "int8-static", "int4"])
def test_openvino_gives_what_onnx_runtime_gives(bundle, precision):
    """Each precision's file on both engines, 2 sizes x 2 batches, judged by the precision's
    own tolerance policy with ONNX Runtime's outputs as the reference."""
    inputs = [sample_inputs(hw, b, seed=3) for hw in SIZES for b in BATCHES]
    with ViTSession(bundle, precision=precision) as ort_s, \
            ViTSession(bundle, provider="openvino", precision=precision,
                       options=RuntimeOptions(threads=1)) as ov_s:
        assert ov_s.providers == ["OpenVINO:CPU"] and ov_s.engine.startswith("openvino ")
        assert ov_s.output_names == ort_s.output_names
        assert ov_s.input_shape == ort_s.input_shape == ["batch", 3, "height", "width"]
        assert ov_s.split_batches == ort_s.split_batches  # dynamic int8 couples a batch on both
        refs = [ort_s.run_all(x) for x in inputs]
        cases = compare(ov_s.run_all, refs, inputs, precision=precision, provider="openvino")
        outs = [ov_s.run_all(x) for x in inputs]
    assert all(c.passed for c in cases), [str(c) for c in cases if not c.passed]
    for out, ref in zip(outs, refs):
        assert {k: (v.shape, v.dtype) for k, v in out.items()} == \
            {k: (v.shape, v.dtype) for k, v in ref.items()}
    worst = max(float(np.abs(o[k] - r[k]).max()) for o, r in zip(outs, refs) for k in r)
    print(f"openvino vs onnxruntime, {precision}: max |diff| {worst:.2e}")


@needs_openvino
def test_predict_features_and_threads_on_openvino(bundle):
    with ViTSession(bundle, provider="openvino") as ov_s, ViTSession(bundle) as ort_s:
        a, b = ov_s.predict([PHOTO], top_k=3)[0], ort_s.predict([PHOTO], top_k=3)[0]
        assert [c.index for c in a.top] == [c.index for c in b.top]
        assert a.top[0].probability == pytest.approx(b.top[0].probability, abs=1e-5)
        assert ov_s.cpu_fallback_nodes() == [] and list(ov_s.placement()) == ["openvino"]
        inputs = [sample_inputs((8 * (1 + i % 4), 16), 1 + i % 3, seed=i) for i in range(12)]
        sequential = [ov_s.run(x) for x in inputs]
        with ThreadPoolExecutor(4) as pool:  # one session shared: a request per call
            threaded = list(pool.map(ov_s.run, inputs * 4))
    for a, b in zip(sequential * 4, threaded):
        np.testing.assert_array_equal(a, b)


@needs_openvino
def test_a_model_compiled_per_shape_gives_what_the_dynamic_one_gives(bundle):
    """static_shapes: OpenVINO's CPU device compiles the model once per input shape met (the
    default there), keeps the last STATIC_SHAPES_KEPT; off, one dynamic model serves all."""
    from vit_deploy.runtime.ov_session import STATIC_SHAPES_KEPT

    inputs = [sample_inputs((8 * (1 + i % 5), 8 * (1 + i // 5)), 1 + i % 2, seed=i)
              for i in range(STATIC_SHAPES_KEPT + 2)]
    with ViTSession(bundle, provider="openvino") as static, \
            ViTSession(bundle, provider="openvino",
                       options=RuntimeOptions(static_shapes=False)) as dynamic:
        assert static._session.static_shapes and not dynamic._session.static_shapes
        for x in inputs:
            np.testing.assert_allclose(static.run(x), dynamic.run(x), rtol=1e-4, atol=1e-4)
        kept = list(static._session._by_shape)
        assert len(kept) == STATIC_SHAPES_KEPT and dynamic._session._by_shape == {}
        assert kept[-1] == (inputs[-1].shape,)  # the last ones met, each its own model
        np.testing.assert_array_equal(static.run(inputs[0]), static.run(inputs[0]))
    with pytest.raises(TypeError, match="static_shapes"):
        RuntimeOptions(static_shapes="yes")


# -- strict selection ---------------------------------------------------------------------
def test_openvino_names_resolve_to_the_engine_not_to_onnx_runtime():
    names = [p.name for p in parse_providers("OpenVINO, openvino-gpu,openvino:gpu.1,cpu")]
    assert names == ["OpenVINO:CPU", "OpenVINO:GPU", "OpenVINO:GPU.1", "CPUExecutionProvider"]
    assert parse_providers("openvino-ep")[0].name == "OpenVINOExecutionProvider"  # ORT's own


def test_openvino_missing_is_an_error_naming_what_was_asked(bundle, no_openvino):
    with pytest.raises(ProviderError, match=r"provider 'openvino' asked for, but the openvino "
                                            r"package is not installed here \(pip install "
                                            r"'vit-deploy\[openvino\]'\); this onnxruntime "
                                            r"lists .*'cpu'"):
        ViTSession(bundle, provider="openvino")
    with pytest.warns(RuntimeWarning, match=r"running on cpu \(the next in your order of "
                                            r"preference\): provider 'openvino' asked for"):
        s = ViTSession(bundle, provider="openvino,cpu")
    assert s.providers == ["CPUExecutionProvider"] and "not installed" in s.fallback_reason
    with pytest.warns(RuntimeWarning, match=r"running on cpu: provider 'openvino'"):
        assert ViTSession(bundle, provider="openvino", fallback=True).providers[0] == \
            "CPUExecutionProvider"
    assert not probe("openvino").usable and "not installed" in probe("openvino").reason
    assert all(not r.name.startswith("OpenVINO:") for r in probe_all().results)


@needs_openvino
def test_an_openvino_device_that_is_missing_is_an_error_naming_the_devices(bundle):
    with pytest.raises(ProviderError, match=r"provider 'openvino-npu' asked for, but OpenVINO "
                                            r"\S+ lists only the device\(s\) \[.*'CPU'.*\] here"):
        ViTSession(bundle, provider="openvino-npu")
    with pytest.raises(ProviderError, match=r"none of the providers asked for is active: "
                                            r"provider 'openvino-npu' .*; provider "
                                            r"'OpenVINO:NOSUCH'"):
        ViTSession(bundle, provider="openvino-npu,openvino:nosuch")
    with pytest.warns(RuntimeWarning, match=r"running on openvino \(the next in your order"):
        s = ViTSession(bundle, provider="openvino-npu,openvino,cpu")
    assert s.providers == ["OpenVINO:CPU"] and "openvino-npu" in s.fallback_reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first choice runs: nothing to say
        assert ViTSession(bundle, provider="openvino,cpu").providers == ["OpenVINO:CPU"]
        assert ViTSession(bundle, provider="cpu,openvino").providers == ["CPUExecutionProvider"]
    assert probe("openvino").usable and not probe("openvino-npu").usable
    assert "openvino" in [r.alias for r in probe_all().results if r.usable]


# -- check, bench, predict across engines -------------------------------------------------
@needs_openvino
def test_check_compares_engines_and_names_the_one_that_ran(bundle, tmp_path):
    """The golden references (no torch) on both engines, every precision: each row names
    the provider that ran; the report names the engines."""
    out = tmp_path / "c.json"
    r = CliRunner().invoke(main, ["check", str(bundle), "--provider", "cpu,openvino",
                                  "--reference", "bundle", "--json", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    ran = {(c["provider"], c["precision"]) for c in data["cases"]}
    assert ran == {(p, q) for p in ("cpu", "openvino")
                   for q in ("fp32", "int8", "int8-static", "int4")}
    assert data["passed"] and not data["unavailable"]
    assert [e.split()[0] for e in data["engines"]] == ["onnxruntime", "openvino"]
    assert "openvino:int8" in {k["subject"] for k in data["checks"]}  # invariants too


@needs_openvino
def test_check_against_pytorch_on_openvino(bundle):
    report = run_check(bundle, CheckOptions(providers=("openvino", "openvino-npu"),
                                            precisions=("fp32", "int8-static"), batches=(2,),
                                            targets=False, reference="pytorch"))
    assert report, report.to_markdown()
    assert {c.provider for c in report.parity.cases} == {"openvino"}
    assert "openvino-npu" in report.unavailable  # reported, not skipped


@needs_openvino
def test_bench_rows_name_the_engine(bundle):
    report = run_bench(bundle, BenchOptions(providers=("cpu", "openvino"), precisions=("int8",),
                                            runs=2, warmup=0, sessions=1, threads=(1,)))
    by = {c.requested: c for c in report.cases}
    assert by["openvino"].provider == "openvino" and len(by["openvino"].latencies_ms) == 2
    assert by["cpu"].provider == "cpu" and report.environment["openvino"]


@needs_openvino
def test_bench_measures_bf16_and_offers_it_only_where_it_holds_on_photographs(bundle, tmp_path):
    """bench --float-precision f32,bf16: each bf16 case is judged on the shipped photographs
    against fp32 by its precision's policy; the budget and the recommendation take it only
    where it passed. ONNX Runtime reports bf16 unavailable; so does a CPU without bf16."""
    ov = import_openvino_quietly()  # as the product imports it: no usage event posted

    out = tmp_path / "bench.json"
    r = CliRunner().invoke(main, ["bench", str(bundle), "--provider", "cpu,openvino",
                                  "--precision", "fp32,int8-static", "--float-precision",
                                  "f32,bf16", "--res", "24x40", "--runs", "2", "--warmup", "0",
                                  "--sessions", "1", "--budget-ms", "100000", "--json", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    cases = {(c["requested"], c["precision"], c["float_precision"]): c for c in report["cases"]}
    assert len(cases) == 8
    for precision in ("fp32", "int8-static"):
        assert cases["cpu", precision, "bf16"]["status"].startswith(
            "unavailable: float_precision bf16 is OpenVINO's setting")
        assert cases["cpu", precision, "f32"]["judged"] is None  # f32: judged when added
    budget = {(b["provider"], b["precision"], b["float_precision"]) for b in report["budget"]}
    if "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        assert all(cases["openvino", p, "bf16"]["status"].startswith("unavailable")
                   for p in ("fp32", "int8-static"))
        assert budget == {(e, p, "f32") for e in ("cpu", "openvino")
                          for p in ("fp32", "int8-static")}
        return
    for precision, floor in (("fp32", 0.99999), ("int8-static", 0.99)):
        case = cases["openvino", precision, "bf16"]
        judged = case["judged"]
        assert "photographs shipped with vit-deploy" in judged["on"] and judged["floor"] == floor
        assert judged["passed"] == (judged["cosine_min"] >= floor), judged
        assert (("openvino", precision, "bf16") in budget) == judged["passed"]
        assert ("not offered" in case["status"]) == (not judged["passed"]), case["status"]
    # int8 with bf16 for the rest holds the int8 policy on the photographs
    assert cases["openvino", "int8-static", "bf16"]["judged"]["passed"]


@needs_openvino
def test_predict_and_providers_commands(bundle):
    r = CliRunner().invoke(main, ["predict", str(bundle), PHOTO, "--provider", "openvino,cpu",
                                  "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["providers"] == ["openvino"]
    r = CliRunner().invoke(main, ["providers", "--quiet"])
    assert r.exit_code == 0 and "openvino" in r.output.split()


@needs_openvino
def test_serve_answers_from_openvino(bundle):
    """`serve` takes whatever ViTSession runs: its /predict answers what the session says."""
    from fastapi.testclient import TestClient

    from vit_deploy.serve.app import make_app

    image = open(PHOTO, "rb").read()
    with ViTSession(bundle, provider="openvino") as s:
        expected = s.predict(image, top_k=3)[0]
        with TestClient(make_app(s, top_k=3)) as client:
            r = client.post("/predict", content=image, headers={"content-type": "image/jpeg"})
            health = client.get("/health").json()
    assert r.status_code == 200, r.text
    assert r.json()["provider"] == "OpenVINO:CPU" and health["providers"] == ["OpenVINO:CPU"]
    assert [t["index"] for t in r.json()["top"]] == [c.index for c in expected.top]


@needs_openvino
def test_bf16_runs_where_the_cpu_has_it_and_is_refused_elsewhere(bundle):
    """float_precision bf16: OpenVINO's CPU device runs what is not int8 in bf16 where it
    lists BF16 among its capabilities (AMX or AVX-512 BF16), and is refused where it does not;
    ONNX Runtime's providers refuse it (never a silently other precision)."""
    ov = import_openvino_quietly()  # as the product imports it: no usage event posted

    x = sample_inputs((24, 40), 2, seed=3)
    options = RuntimeOptions(float_precision="bf16")
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        with ViTSession(bundle, provider="openvino", precision="int8-static",
                        options=options) as bf16, \
                ViTSession(bundle, provider="openvino", precision="int8-static") as f32:
            assert bf16._session.config["INFERENCE_PRECISION_HINT"] == "bf16"
            assert f32._session.config["INFERENCE_PRECISION_HINT"] == "f32"
            a, b = bf16.run(x).ravel(), f32.run(x).ravel()
            assert not np.array_equal(a, b)  # another precision did run
            assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99
    else:
        with pytest.raises(ProviderError) as e:  # compiled in f32, or not compiled at all
            ViTSession(bundle, provider="openvino", options=options)
        assert "lists no BF16 among CPU's capabilities" in str(e.value)
    with pytest.raises(ProviderError, match="float_precision bf16 is OpenVINO's setting"):
        ViTSession(bundle, provider="cpu", options=options)
    with pytest.raises(ValueError, match="float_precision must be one of"):
        RuntimeOptions(float_precision="fp8")


@needs_openvino
def test_bf16_is_refused_where_the_device_lists_no_bf16(bundle, openvino_without_bf16):
    """OpenVINO 2026 compiles bf16 on an AVX-512 CPU without BF16 (emulated: 42x slower than
    f32 on such a Xeon, docs/cpu-speed.md); the session refuses it by the device's
    capabilities, on any CPU (here the capability list is made to lack BF16)."""
    with pytest.raises(ProviderError, match=r"lists no BF16 among CPU's capabilities \['"):
        ViTSession(bundle, provider="openvino", options=RuntimeOptions(float_precision="bf16"))
    with ViTSession(bundle, provider="openvino") as f32:  # f32 asks no capability
        assert f32._session.config["INFERENCE_PRECISION_HINT"] == "f32"


@needs_openvino
def test_bf16_on_a_device_that_names_no_capabilities_is_refused_in_one_line(bundle, monkeypatch):
    ov = import_openvino_quietly()
    real = ov.Core.get_property

    def silent(self, device, name):
        if name == "OPTIMIZATION_CAPABILITIES":  # as a plugin without the property answers
            raise RuntimeError(f"Unsupported property {name} by {device} plugin")
        return real(self, device, name)

    monkeypatch.setattr(ov.Core, "get_property", silent)
    with pytest.raises(ProviderError, match=r"lists no BF16 among CPU's capabilities \[\] "):
        ViTSession(bundle, provider="openvino", options=RuntimeOptions(float_precision="bf16"))
