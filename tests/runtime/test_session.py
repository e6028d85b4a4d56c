import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from vit_deploy.runtime.contract import MANIFEST_NAME, MODEL_FILE
from vit_deploy.parity import batch_independence, sample_inputs
from vit_deploy.runtime import (BundleError, InputError, ProviderError, RuntimeOptions, ViTSession,
                                parse_providers, probe)


def test_session_runs_bundle_and_matches_torch(tiny_bundle, torch_logits):
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
    inputs = [sample_inputs((8 * (1 + i % 5), 16), 1 + i % 3, seed=i) for i in range(50)]
    with ViTSession(result.path) as s:
        sequential = [s.run(x) for x in inputs]
        with ThreadPoolExecutor(8) as pool:  # 8 threads x 50 runs each
            threaded = list(pool.map(s.run, inputs * 8))
    sequential = sequential * 8
    for a, b in zip(sequential, threaded):
        np.testing.assert_array_equal(a, b)


def test_provider_aliases_resolve_case_insensitively():
    names = [p.name for p in parse_providers("CUDA, cpu")]
    assert names == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert parse_providers([("cuda", {"device_id": 1})])[0].options == {"device_id": 1}
    with pytest.raises(ValueError, match="unknown provider 'gpu'; known: .*cpu.*cuda"):
        parse_providers("gpu")


@pytest.mark.skipif(probe("cuda").usable, reason="CUDA really runs here; the strict error cannot happen")
def test_cuda_that_cannot_run_is_an_error_not_a_silent_cpu_run(tiny_bundle):
    _, result = tiny_bundle
    with pytest.raises(ProviderError, match=r"\['cuda'\] asked for but not active; active: "
                                            r"\['cpu'\].*onnxruntime says: .*(?i:fail)"):
        ViTSession(result.path, provider="cuda")
    with pytest.raises(ProviderError, match=r"none of the providers asked for is active"):
        ViTSession(result.path, provider="cuda,tensorrt")  # a list, none of it active
    with pytest.warns(RuntimeWarning, match=r"running on cpu: provider\(s\) \['cuda', "
                                            r"'tensorrt'\] asked for but not active"):
        s = ViTSession(result.path, provider="cuda,tensorrt", fallback=True)
    assert s.providers == ["CPUExecutionProvider"]


def test_a_provider_list_is_an_order_of_preference(tiny_bundle):
    """'cuda,cpu' runs on the first active provider and says which (the README's first
    snippet on a machine without CUDA)."""
    _, result = tiny_bundle
    with pytest.warns(RuntimeWarning, match=r"running on cpu \(the next in your order of "
                                            r"preference\): provider\(s\) \['cuda'\]"):
        s = ViTSession(result.path, provider="cuda,cpu")
    assert s.providers == ["CPUExecutionProvider"] and "cuda" in s.fallback_reason
    with pytest.warns(RuntimeWarning, match=r"\['coreml', 'cuda'\] asked for"):
        s = ViTSession(result.path, provider=["coreml", "cuda", "cpu"])
    assert s.providers == ["CPUExecutionProvider"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first choice active: nothing to say
        assert ViTSession(result.path, provider="cpu,cuda").providers[0] == "CPUExecutionProvider"


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


def test_predict_with_labels_features_and_top_k(tmp_path, make_tiny):
    from PIL import Image

    from vit_deploy.export.bundle import ExportOptions, export_bundle

    labels = tuple(f"class-{i}" for i in range(10))
    result = export_bundle(make_tiny(), tmp_path / "b", options=ExportOptions(
        resolution=(32, 32), features=True, labels=labels, simplify=False))
    images = [np.full((40, 50, 3), v, np.uint8) for v in (0, 128, 255)]
    path = tmp_path / "img.png"
    Image.fromarray(images[1]).save(path)
    with ViTSession(result.path) as s:
        preds = s.predict([images[0], path, Image.fromarray(images[2])], top_k=3)
        assert [len(p.top) for p in preds] == [3, 3, 3]
        assert preds[1].source == str(path) and preds[1].input_size == (32, 32)
        probs = [c.probability for c in preds[0].top]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
        assert preds[0].top[0].label == f"class-{preds[0].top[0].index}"
        # the same image as an array and as a file gives the same answer
        again = s.predict(images[1], top_k=3)[0]
        assert [c.index for c in again.top] == [c.index for c in preds[1].top]
        pooled = s.pooled(sample_inputs((16, 16), 2))
        assert pooled.shape == (2, 48)
        with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
            s.predict(images[0], top_k=0)


def test_missing_outputs_are_explained(tiny_bundle):
    _, result = tiny_bundle
    with ViTSession(result.path) as s:
        with pytest.raises(BundleError, match="no 'pooled' output.*--outputs logits,pooled"):
            s.pooled(sample_inputs((8, 8), 1))
        with pytest.raises(BundleError, match="no 'patch_tokens' output.*--outputs"):
            s.features(np.zeros((20, 30, 3), np.uint8))


def test_placement_comes_from_ort_profile(tiny_bundle):
    _, result = tiny_bundle
    with ViTSession(result.path) as s:
        placement = s.placement()
        assert list(placement) == ["cpu"] and len(placement["cpu"]) > 10
        assert s.cpu_fallback_nodes() == []  # cpu was asked for: nothing fell back


def test_io_binding_gives_the_same_results(tiny_bundle):
    _, result = tiny_bundle
    x = sample_inputs((24, 32), 2)
    with ViTSession(result.path) as plain, \
            ViTSession(result.path, options=RuntimeOptions(io_binding=True)) as bound:
        np.testing.assert_array_equal(plain.run(x), bound.run(x))


def test_optimized_graph_cache_is_written_then_used(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(result.path, bundle)
    x = sample_inputs((16, 24), 1)
    opts = RuntimeOptions(cache_optimized=True)
    with ViTSession(bundle) as s:
        expected = s.run(x)
    with ViTSession(bundle, options=opts) as first:
        assert not first.cache_hit
        np.testing.assert_allclose(first.run(x), expected, atol=1e-6)
    cached = list((bundle / ".ort-cache").glob("*.onnx"))
    assert len(cached) == 1
    with ViTSession(bundle, options=opts) as second:
        assert second.cache_hit
        np.testing.assert_allclose(second.run(x), expected, atol=1e-6)
    # a cache that does not match its record is ignored and rewritten, not trusted
    cached[0].write_bytes(b"garbage")
    with ViTSession(bundle, options=opts) as third:
        assert not third.cache_hit
        np.testing.assert_allclose(third.run(x), expected, atol=1e-6)
    assert cached[0].read_bytes() != b"garbage"


def test_nonfinite_inputs_can_be_rejected(tiny_bundle):
    _, result = tiny_bundle
    x = sample_inputs((8, 8), 1)
    x[0, 0, 0, 0] = np.nan
    with ViTSession(result.path, options=RuntimeOptions(reject_nonfinite=True)) as s:
        with pytest.raises(InputError, match="1 NaN/Inf"):
            s.run(x)


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
