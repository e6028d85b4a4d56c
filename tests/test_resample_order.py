"""The pass order of Pillow's two-pass resize, which web/src/lib/resample.mjs reproduces
(`verticalFirst`): the intermediate image is 8-bit, so the order changes the bytes.

Found by experiment against Pillow 13.0.0: the vertical pass runs first when the height
shrinks by more than twice what the width shrinks by, in pixels (a width that grows or
stays counts as 0); otherwise the horizontal pass runs first (every Pillow before 13).
If a Pillow upgrade changes this, this test fails and resample.mjs must follow."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from PIL import Image

from vit_deploy.runtime.contract import INTERPOLATIONS


def vertical_first(in_w: int, in_h: int, out_w: int, out_h: int) -> bool:
    """resample.mjs's rule, written again."""
    return in_h - out_h > max(0, 2 * (in_w - out_w))


def _order(image: Image.Image, size: tuple[int, int], f: Image.Resampling) -> str:
    """'H' or 'V': the explicit two-pass order (done by Pillow itself) whose bytes equal
    Pillow's one-call resize; '=' when both do; '?' when neither does."""
    (in_w, in_h), (out_w, out_h) = image.size, size
    direct = np.asarray(image.resize(size, f))
    h = np.array_equal(direct, np.asarray(image.resize((out_w, in_h), f).resize(size, f)))
    v = np.array_equal(direct, np.asarray(image.resize((in_w, out_h), f).resize(size, f)))
    return "=" if h and v else "H" if h else "V" if v else "?"


# sizes either side of the boundary (in_h - out_h == 2 * (in_w - out_w)), widths that grow,
# shrink and stay, heights that grow and shrink, and the preprocessing sizes the web tests use
GRID = sorted({(iw, oh + d + 2 * max(0, iw - ow), ow, oh)
               for iw, ow, oh in itertools.product((9, 40, 71), (9, 40, 71), (5, 33))
               for d in (-3, -1, 0, 1, 2, 7)} |
              {(iw, ih, ow, oh) for iw, ih, ow, oh in itertools.product(
                  (13, 50), (11, 64), (12, 50), (20, 63)) if ih >= 1} |
              {(110, 150, 96, 96), (97, 129, 96, 96), (260, 600, 224, 517),
               (260, 600, 96, 222), (260, 600, 71, 164), (512, 600, 224, 262)})


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_pillow_pass_order_is_the_rule_resample_mjs_follows(interpolation):
    f = Image.Resampling[interpolation.upper()]
    rng = np.random.default_rng(0)
    wrong, seen = [], set()
    for iw, ih, ow, oh in GRID:
        image = Image.fromarray(rng.integers(0, 256, (ih, iw, 3), dtype=np.uint8))
        order = _order(image, (ow, oh), f)
        seen.add(order)
        if interpolation == "nearest":  # a selection of source pixels: no order to tell
            if order != "=":
                wrong.append((iw, ih, ow, oh, order))
        elif order == "?" or (order != "=" and (order == "V") != vertical_first(iw, ih, ow, oh)):
            wrong.append((iw, ih, ow, oh, order, vertical_first(iw, ih, ow, oh)))
    assert not wrong, f"Pillow {Image.__version__} {interpolation}: {wrong[:10]}"
    if interpolation != "nearest":  # the grid tells the two orders apart, both ways
        assert {"H", "V"} <= seen
