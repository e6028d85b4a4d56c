import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest

from conftest import torch_logits
from vit_deploy.contract import MANIFEST_NAME, MODEL_FILE
from vit_deploy.parity import sample_inputs
from vit_deploy.runtime import BundleError, InputError, ProviderError, ViTSession, parse_providers


def test_runtime_import_does_not_import_torch():
    code = textwrap.dedent("""
        import sys
        import vit_deploy.runtime
        from vit_deploy.runtime import ViTSession
        import vit_deploy.parity, vit_deploy.sizes, vit_deploy.contract, vit_deploy.atomic
        bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        assert not bad, bad
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_session_runs_bundle_and_matches_torch(tiny_bundle):
    model, result = tiny_bundle
    with ViTSession(result.path) as s:
        assert s.providers == ["CPUExecutionProvider"]
        x = sample_inputs((40, 24), 2)
        np.testing.assert_allclose(s.run(x), torch_logits(model, x), atol=1e-5)


def test_session_accepts_a_plain_onnx_file(tiny_bundle):
    _, result = tiny_bundle
    with ViTSession(result.path / MODEL_FILE) as s:
        assert s.patch_size == 8
        assert s.run(sample_inputs((8, 8), 1)).shape == (1, 10)


@pytest.mark.parametrize("x,match", [
    (np.zeros((3, 32, 32), np.float32), "4-D array"),
    (np.zeros((1, 3, 32, 32), np.uint8), "float32"),
    (np.zeros((0, 3, 32, 32), np.float32), "at least one image"),
    (np.zeros((1, 4, 32, 32), np.float32), "expected 3 channels, got 4"),
    (np.zeros((1, 3, 30, 32), np.float32), "height 30 .* patch size 8"),
    ([[1.0]], "numpy array"),
])
def test_bad_inputs_say_what_was_expected(tiny_bundle, x, match):
    _, result = tiny_bundle
    with ViTSession(result.path) as s, pytest.raises(InputError, match=match):
        s.run(x)


def test_one_session_many_threads_same_results(tiny_bundle):
    _, result = tiny_bundle
    inputs = [sample_inputs((8 * (1 + i % 5), 16), 1 + i % 3, seed=i) for i in range(40)]
    with ViTSession(result.path) as s:
        sequential = [s.run(x) for x in inputs]
        with ThreadPoolExecutor(8) as pool:
            threaded = list(pool.map(s.run, inputs))
    for a, b in zip(sequential, threaded):
        np.testing.assert_array_equal(a, b)


def test_provider_aliases_resolve_case_insensitively():
    names = [p.name for p in parse_providers("CUDA, cpu")]
    assert names == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert parse_providers([("cuda", {"device_id": 1})])[0].options == {"device_id": 1}
    with pytest.raises(ValueError, match="unknown provider 'gpu'; known: .*cpu.*cuda"):
        parse_providers("gpu")


def _cuda_works() -> bool:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    try:
        import onnx
        from onnx import TensorProto, helper

        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 10
        s = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        return s.get_providers()[0] == "CUDAExecutionProvider" and onnx is not None
    except Exception:
        return False


@pytest.mark.skipif(_cuda_works(), reason="CUDA really runs here; the strict error cannot happen")
def test_cuda_that_cannot_run_is_an_error_not_a_silent_cpu_run(tiny_bundle):
    _, result = tiny_bundle
    with pytest.raises(ProviderError, match="cuda"):
        ViTSession(result.path, provider="cuda")
    with pytest.warns(RuntimeWarning, match="falling back"):
        s = ViTSession(result.path, provider="cuda,cpu", fallback=True)
    assert s.providers == ["CPUExecutionProvider"]


def test_tampered_or_broken_bundles_are_refused(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    cases = {
        "tampered": lambda d: (d / MODEL_FILE).write_bytes(
            (d / MODEL_FILE).read_bytes()[:-1] + b"\x00"),
        "truncated": lambda d: (d / MODEL_FILE).write_bytes((d / MODEL_FILE).read_bytes()[:1000]),
        "missing": lambda d: (d / MODEL_FILE).unlink(),
        "not-json": lambda d: (d / MANIFEST_NAME).write_text("{nope"),
    }
    expected = {"tampered": "sha256", "truncated": "bytes", "missing": "missing",
                "not-json": "not valid JSON"}
    for name, damage in cases.items():
        d = tmp_path / name
        shutil.copytree(result.path, d)
        damage(d)
        with pytest.raises(BundleError, match=expected[name]):
            ViTSession(d)


def test_unknown_precision_lists_what_the_bundle_has(tiny_bundle):
    _, result = tiny_bundle
    with pytest.raises(BundleError, match=r"no 'int8' model; it has \['fp32'\]"):
        ViTSession(result.path, precision="int8")
