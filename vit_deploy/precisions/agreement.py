"""How far a verdict taken on some photographs carries to others, and agreement in the
user's terms (nearest neighbours kept, top-k classes kept). Torch-free.

A worst-image cosine is a property of the images it was taken on: six photographs gave
0.99738 and 24 others 0.9940 for the same int8 file (the trained DINOv2-S at 224, issue 61).
`expected_worst` states, beside the observed figure, what the worst of as many other
photographs is expected to be: each photograph's error 1 - cosine is treated as
log-normal (quantisation error is multiplicative: one image's is a few times another's,
and the logarithms of the trained DINOv2-S's per-image errors are near symmetric), its mean
and spread estimated from the photographs judged, and the bound is the 95 % point of the
worst of `others` new draws, the estimate's own uncertainty in both counted (a prediction
interval, exact under that model: tests/precisions/test_agreement.py checks its coverage).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist

import numpy as np

CONFIDENCE = 0.95  # of the expected worst image on other photographs
MIN_PHOTOGRAPHS = 16  # under this many distinct photographs a verdict warns it is thin
NEIGHBOURS = 5  # k of the nearest-neighbour agreement (cosine, within the judged images)
TOP_K = 5  # of the classes' agreement, beside top-1
ERROR_FLOOR = 1e-9  # 1 - cosine below this (bit-equal outputs) counts as this
SIMULATIONS = 20_000  # draws behind expected_worst's factor


def per_photograph(cosines: np.ndarray, groups: Sequence[int] | None) -> np.ndarray:
    """Each photograph's worst cosine over its views (crops of one photograph are not
    independent samples: the estimate counts photographs, not views)."""
    cosines = np.asarray(cosines, dtype=np.float64)
    if groups is None or len(groups) != len(cosines):
        return cosines
    g = np.asarray(groups)
    return np.array([cosines[g == k].min() for k in dict.fromkeys(g.tolist())])


def expected_worst(cosines: np.ndarray, others: int, *,
                   confidence: float = CONFIDENCE) -> float | None:
    """The cosine that the worst of `others` other photographs stays above with
    `confidence`, from the per-photograph `cosines` judged (None under 3 of them)."""
    n = len(cosines)
    if n < 3 or others < 1:
        return None
    logs = np.log(np.maximum(1.0 - np.asarray(cosines, dtype=np.float64), ERROR_FLOOR))
    mean, spread = float(logs.mean()), float(logs.std(ddof=1))
    return float(1.0 - math.exp(min(0.0, mean + _factor(n, others, confidence) * spread)))


@lru_cache(maxsize=256)
def _factor(n: int, others: int, confidence: float) -> float:
    """k such that mean + k * spread of `n` normal draws stays above the largest of `others`
    new draws with `confidence`. (largest - mean) / spread does not depend on the normal's
    own mean and spread, so k is read off standard normal draws (seeded, 20,000 of them):
    the estimate's uncertainty in both mean and spread is in it, as a plug-in z is not."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SIMULATIONS, n))
    largest = np.array([NormalDist().inv_cdf(u ** (1.0 / others))  # max of `others` draws
                        for u in rng.uniform(1e-12, 1.0 - 1e-12, SIMULATIONS)])
    return float(np.quantile((largest - x.mean(1)) / x.std(1, ddof=1), confidence))


def neighbours_kept(ref: np.ndarray, out: np.ndarray, k: int = NEIGHBOURS
                    ) -> np.ndarray | None:
    """For each image, the share of its `k` nearest neighbours (cosine, among the other
    images of the set) under fp32 that stay among its `k` nearest under the candidate:
    what a search or deduplication index built on the embedding keeps. (n,) or None when
    the set has `k` + 1 images or fewer."""
    n = len(ref)
    if n <= k + 1:  # with k + 1 images every other image is a neighbour: nothing to lose
        return None

    def ranks(x: np.ndarray) -> np.ndarray:
        x = x.reshape(n, -1).astype(np.float64)
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
        sim = x @ x.T
        np.fill_diagonal(sim, -np.inf)  # an image is not its own neighbour
        return np.argsort(-sim, axis=1, kind="stable")[:, :k]

    a, b = ranks(ref), ranks(out)
    return np.array([len(set(a[i]) & set(b[i])) / k for i in range(n)])


def top_k_agree(ref: np.ndarray, out: np.ndarray, k: int = TOP_K) -> float | None:
    """The mean share of fp32's top `k` classes that stay in the candidate's top `k`
    (None for fewer than k + 1 classes: the top k would be nearly every class)."""
    if ref.ndim != 2 or ref.shape[1] <= k:
        return None
    a = np.argsort(-ref, axis=1, kind="stable")[:, :k]
    b = np.argsort(-out, axis=1, kind="stable")[:, :k]
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))
