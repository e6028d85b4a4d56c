import numpy as np
import pytest

from vit_deploy.parity import ParityError, ParityReport, batch_independence, judge, metrics


def test_metrics_of_identical_and_scaled_outputs():
    ref = np.random.default_rng(0).standard_normal((3, 10)).astype(np.float32)
    m = metrics(ref, ref.copy())
    assert m["max_abs"] == 0 and m["cosine"] == pytest.approx(1.0) and m["top1_agree"] == 1
    flipped = -ref
    assert metrics(ref, flipped)["cosine"] == pytest.approx(-1.0)


def test_fp32_policy_scales_with_reference_and_fails_beyond():
    ref = np.full((2, 4), 50.0, dtype=np.float32)
    ref[:, 0] = 60.0
    ok = judge(ref, ref + 4e-3, resolution=(32, 32), provider="cpu")  # 4e-3 <= 1e-4 * 60
    bad = judge(ref, ref + 7e-3, resolution=(32, 32), provider="cpu")
    assert ok.passed and not bad.passed
    assert ok.abs_tol == pytest.approx(6e-3)


def test_nan_output_fails_even_if_cosine_is_fine():
    ref = np.ones((1, 4), dtype=np.float32)
    out = ref.copy()
    out[0, 0] = np.nan
    assert not judge(ref, out, resolution=(8, 8), provider="cpu").passed


def test_report_collects_all_failures():
    ref = np.ones((1, 3), dtype=np.float32)
    cases = [judge(ref, ref, resolution=(8, 8), provider="cpu"),
             judge(ref, ref * 2, resolution=(16, 16), provider="cpu")]
    report = ParityReport(cases=cases)
    assert not report and len(report.failures) == 1
    text = str(ParityError(report))
    assert "16x16 b1" in text and "FAIL" in text and "8x8 b1" in text


def test_batch_independence_catches_a_leak():
    def leaky(x):  # mixes the batch, like nn.MultiheadAttention without batch_first
        return x.mean(axis=(2, 3)) + x.mean(axis=(0, 2, 3))

    def clean(x):
        return x.mean(axis=(2, 3))

    assert not batch_independence(leaky, (8, 8), subject="leaky").passed
    assert batch_independence(clean, (8, 8), subject="clean").passed


@pytest.mark.parametrize("forward", ["leaky", "clean"])
def test_batch_independence_on_a_batch_already_run_runs_only_the_changed_one(forward):
    """The export hands in a parity case (input, outputs): one more run, same verdict."""
    calls = []

    def run(x):
        calls.append(x.copy())
        out = x.mean(axis=(2, 3))
        return out + x.mean(axis=(0, 2, 3)) if forward == "leaky" else out

    x = np.random.default_rng(0).standard_normal((4, 3, 8, 8), dtype=np.float32)
    check = batch_independence(run, (8, 8), subject=forward, given=(x, run(x)))
    assert len(calls) == 2 and np.array_equal(calls[1][:-1], x[:-1])  # the last image changed
    assert not np.array_equal(calls[1][-1], x[-1])
    assert check.passed == (forward == "clean") and "b4" in check.detail
