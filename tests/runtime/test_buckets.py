"""The bucket policy (runtime/buckets.py): nearest aspect ratio, then area."""

import numpy as np
import pytest

from vit_deploy.runtime.buckets import bucket_batches, choose_bucket
from vit_deploy.runtime.preprocess import Preprocess

BUCKETS = [(224, 224), (256, 320), (448, 448)]  # (H, W)


# (width, height) -> the bucket, each worked out by hand: aspect is H/W, compared on a log
# scale; among the nearest aspects the smallest bucket that covers the image's area, else
# the largest.
@pytest.mark.parametrize("width,height,bucket", [
    (640, 480, (256, 320)),  # 0.75 is nearest 0.8 (log distance 0.065 vs 0.288 to 1)
    (100, 100, (224, 224)),  # square: both square buckets cover 10,000 px; the smaller
    (300, 300, (448, 448)),  # 90,000 px: 224² = 50,176 does not cover, 448² does
    (4000, 4000, (448, 448)),  # none covers 16 M px: the largest square
    (480, 640, (448, 448)),  # 1.33 is nearer 1 (0.288) than 0.8 (0.511); none covers: largest
    (1000, 200, (256, 320)),  # 0.2: log distance 1.386 to 0.8, 1.609 to 1
    (320, 256, (256, 320)),  # 0.8 exactly
])
def test_the_chosen_bucket_has_the_nearest_aspect_then_the_smallest_covering_area(
        width, height, bucket):
    assert choose_bucket(width, height, BUCKETS) == bucket


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
