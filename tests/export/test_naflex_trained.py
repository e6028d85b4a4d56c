"""int8 on a trained SigLIP 2 NaFlex tower, not on noise: the digits tower shipped with the
package (scripts/train_digits_naflex.py) exported with --naflex, quantised as `quantize`
does (judged on the shipped photographs), then measured on its held-out digits, each at its
own aspect ratio (benchmarks/naflex_digits.py, whose figures the README quotes)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vit_deploy.data import DIGITS_NAFLEX_RECORD_FILE, DIGITS_NAFLEX_RATIOS, data_path

ROOT = Path(__file__).resolve().parents[2]


def _measure(out: Path) -> dict:
    spec = importlib.util.spec_from_file_location(
        "naflex_digits", ROOT / "benchmarks" / "naflex_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure(out)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return _measure(tmp_path_factory.mktemp("naflex-digits"))


def test_the_shipped_tower_is_the_trained_one_and_matches_transformers(measured):
    record = json.loads(data_path(DIGITS_NAFLEX_RECORD_FILE).read_text())
    # ORT fp32 through the bundle classifies as the training script measured in PyTorch
    assert abs(measured["accuracy"]["fp32"] - record["held_out_accuracy"]) <= 1 / 359 + 1e-9
    assert measured["accuracy"]["fp32"] >= 0.85  # trained: chance is 0.1
    assert measured["ort_fp32_vs_transformers_max_rel"] < 1e-4
    assert len(measured["accuracy_per_ratio"]) == len(DIGITS_NAFLEX_RATIOS)


def test_int8_keeps_the_trained_towers_accuracy_and_embedding(measured):
    assert measured["int8_passed"]
    # the bar, on real photographs at their own aspect ratios and cropped 1:4 .. 4:1
    assert measured["photos_cosine_min"]["pooled"] >= 0.999
    assert measured["accuracy"]["int8"] >= measured["accuracy"]["fp32"] - 0.01
    assert measured["digits_pooled_cosine_int8"]["min"] >= 0.99
