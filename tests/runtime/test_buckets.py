"""The bucket policy (runtime/buckets.py): nearest aspect ratio, then area."""

import math

import numpy as np
import pytest

from vit_deploy.runtime.buckets import bucket_batches, choose_bucket
from vit_deploy.runtime.preprocess import Preprocess

BUCKETS = [(224, 224), (256, 320), (448, 448)]  # (H, W)


def _log_aspect_distance(width, height, bucket):
    return abs(math.log(bucket[0] / bucket[1]) - math.log(height / width))


@pytest.mark.parametrize("width,height", [(640, 480), (100, 100), (300, 300), (4000, 4000),
                                          (480, 640), (1000, 200), (320, 256)])
def test_the_chosen_bucket_has_the_nearest_aspect_then_the_smallest_covering_area(width, height):
    chosen = choose_bucket(width, height, BUCKETS)
    best = min(_log_aspect_distance(width, height, b) for b in BUCKETS)
    assert _log_aspect_distance(width, height, chosen) == pytest.approx(best)
    same = [b for b in BUCKETS if _log_aspect_distance(width, height, b) == pytest.approx(best)]
    covering = [b for b in same if b[0] * b[1] >= width * height]
    assert chosen == (min(covering, key=lambda b: b[0] * b[1]) if covering
                      else max(same, key=lambda b: b[0] * b[1]))


def test_named_cases():
    assert choose_bucket(640, 480, BUCKETS) == (256, 320)  # 4:3 landscape: the 4:5 bucket
    assert choose_bucket(100, 100, BUCKETS) == (224, 224)  # small square: no upscaling to 448
    assert choose_bucket(300, 300, BUCKETS) == (448, 448)  # larger than 224²: keep detail
    assert choose_bucket(5000, 5000, BUCKETS) == (448, 448)  # larger than all: the largest


def test_bad_requests_say_what_was_expected():
    with pytest.raises(ValueError, match="policy must be one of .*aspect-then-area.*'pad'"):
        choose_bucket(10, 10, BUCKETS, policy="pad")
    with pytest.raises(ValueError, match="no buckets"):
        choose_bucket(10, 10, [])
    with pytest.raises(ValueError, match="0x10"):
        choose_bucket(0, 10, BUCKETS)


def test_images_are_preprocessed_at_their_bucket_and_grouped():
    pre = Preprocess(resolution=(32, 32), patch_size=8, mean=(0.5,) * 3, std=(0.5,) * 3)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
              for h, w in [(30, 40), (32, 32), (60, 80), (10, 10)]]
    groups = bucket_batches(images, pre, [(32, 32), (24, 32)])
    shapes = {tuple(b.shape[2:]): idx for idx, b in groups}
    assert shapes == {(24, 32): [0, 2], (32, 32): [1, 3]}
    # the same pixels as the manifest's centre-crop rule at the bucket's size
    at = Preprocess(resolution=(24, 32), patch_size=8, mean=(0.5,) * 3, std=(0.5,) * 3)
    batch = dict((tuple(b.shape[2:]), b) for _, b in groups)[(24, 32)]
    np.testing.assert_array_equal(batch[1], at(images[2]))
