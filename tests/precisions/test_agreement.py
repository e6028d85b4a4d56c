"""How far a verdict carries to other photographs, and agreement in the user's terms
(vit_deploy/precisions/agreement.py)."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from vit_deploy.precisions.agreement import (expected_worst, neighbours_kept, per_photograph,
                                             top_k_agree)
from vit_deploy.precisions.photos import judge_photos


@pytest.mark.parametrize("n,others", [(10, 50), (20, 50), (50, 50), (6, 24)])
def test_the_expected_worst_holds_on_other_photographs_as_often_as_it_says(n, others):
    """Per-photograph errors drawn log-normal (as quantisation error is): the bound taken on
    `n` photographs holds for the worst of `others` new ones in about 95 % of draws, and is
    not a bound that holds by being useless (it sits above the 1st percentile of a
    one-in-a-thousand bound)."""
    rng = np.random.default_rng(0)
    held, bounds = [], []
    for _ in range(2000):
        errors = np.exp(rng.normal(-6.0, 0.8, n))  # median 1 - cosine 0.0025
        bound = expected_worst(1.0 - errors, others)
        new = 1.0 - np.exp(rng.normal(-6.0, 0.8, others)).max()
        held.append(new >= bound)
        bounds.append(bound)
    assert 0.935 <= np.mean(held) <= 0.965, np.mean(held)
    # the true 95 % point of the worst of `others`; a bound from few photographs is wider
    # (its spread is uncertain), from 20 or more within twice the true error
    true_error = np.exp(-6.0 + 0.8 * NormalDist().inv_cdf(0.95 ** (1 / others)))
    assert np.median(1.0 - np.array(bounds)) > true_error * 0.9
    if n >= 20:
        assert np.median(1.0 - np.array(bounds)) < 2.0 * true_error


def test_the_expected_worst_needs_three_photographs_and_grows_with_their_spread():
    assert expected_worst(np.array([0.999, 0.998]), 10) is None
    tight = expected_worst(np.array([0.9980, 0.9981, 0.9979, 0.9980]), 10)
    loose = expected_worst(np.array([0.9990, 0.9950, 0.9999, 0.9980]), 10)
    assert loose < tight < 0.9979  # below every observed image: other photographs vary
    assert expected_worst(np.ones(5), 10) == pytest.approx(1.0, abs=1e-8)  # bit-equal


def test_crops_of_one_photograph_count_once():
    cos = np.array([0.999, 0.995, 0.998, 0.997, 0.999, 0.996])
    assert per_photograph(cos, [0, 0, 0, 1, 1, 1]).tolist() == [0.995, 0.996]
    assert per_photograph(cos, None).tolist() == cos.tolist()


def test_neighbours_kept_counts_what_a_search_index_keeps():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((12, 16))
    assert neighbours_kept(ref, ref * 3.0).tolist() == [1.0] * 12  # scale: same neighbours
    noisy = neighbours_kept(ref, ref + 5.0 * rng.standard_normal(ref.shape))
    assert noisy.min() < 1.0 and noisy.shape == (12,)
    swapped = ref.copy()  # image 0's nearest neighbour moved far away: 0 loses one
    near = np.argsort(-(ref / np.linalg.norm(ref, axis=1, keepdims=True)
                        @ (ref[0] / np.linalg.norm(ref[0]))))[1]
    swapped[near] = -ref[0]
    kept = neighbours_kept(ref, swapped)
    assert kept[0] == pytest.approx(0.8)
    assert neighbours_kept(ref[:6], ref[:6]) is None  # 6 images: all the others are neighbours


def test_top_k_agree_is_the_share_of_fp32s_top_classes_kept():
    ref = np.array([[9.0, 8, 7, 6, 5, 0, 0, 0], [1.0, 2, 3, 4, 5, 6, 7, 8]])
    out = ref.copy()
    out[0, 4], out[0, 5] = 0.0, 5.0  # class 4 leaves the top 5, class 5 enters
    assert top_k_agree(ref, out) == pytest.approx((4 / 5 + 1) / 2)
    assert top_k_agree(ref[:, :5], out[:, :5]) is None  # 5 classes: top 5 is all of them


def test_judge_photos_names_the_worst_image_and_counts_photographs():
    rng = np.random.default_rng(2)
    ref = {"pooled": rng.standard_normal((6, 32)), "logits": rng.standard_normal((6, 10))}
    out = {k: v + 0.01 * rng.standard_normal(v.shape) for k, v in ref.items()}
    out["pooled"][4] = ref["pooled"][4] + 0.5 * rng.standard_normal(32)
    labels = [f"p{i // 3}.jpg (view {i % 3})" for i in range(6)]
    cases = {c.output: c for c in judge_photos(ref, out, resolution=(32, 32), precision="int8",
                                               labels=labels, groups=[0, 0, 0, 1, 1, 1])}
    pooled = cases["pooled"]
    assert pooled.worst_image == "p1.jpg (view 1)" and pooled.photographs == 2
    assert pooled.expected_worst is None  # two photographs: no spread to estimate from
    assert pooled.neighbours_kept is None  # 6 images: 5 neighbours each, all of the rest
    assert cases["logits"].top5_agree is not None and cases["logits"].neighbours_kept is None
    many = judge_photos(ref, out, resolution=(32, 32), precision="int8", others=50)
    assert many[0].photographs == 6 and many[0].expected_worst < many[0].cosine_min
