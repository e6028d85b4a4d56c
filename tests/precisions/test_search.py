"""The recipe search's choice between candidates (vit_deploy/precisions/search.py), on scores alone."""

from __future__ import annotations

import pytest

from vit_deploy.precisions.evaluate import Score
from vit_deploy.precisions.search import _better, target

GOAL = target("int8")  # worst 0.997, tokens p1 0.991


def test_the_int8_target_is_stricter_than_the_policy():
    assert GOAL.worst == pytest.approx(0.997) and GOAL.token_p1 == pytest.approx(0.991)


@pytest.mark.parametrize("candidate,best,better", [
    # met beats not met, even with a lower worst image (the trained DINOv2-S's int8-static)
    (Score(0.99765, 0.99372), Score(0.99767, 0.98982), True),
    (Score(0.99767, 0.98982), Score(0.99765, 0.99372), False),
    # neither met: the worst image decides
    (Score(0.99736, 0.98809), Score(0.99669, 0.99139), True),
    (Score(0.99669, 0.99139), Score(0.99736, 0.98809), False),
    (Score(0.99650, None), Score(0.99640, None), True),  # no token axis
    # equal within rounding: the faster (earlier) one stays
    (Score(0.99600, 0.98900), Score(0.9960000001, 0.98900), False),
])
def test_a_candidate_is_kept_only_when_it_comes_nearer_the_target(candidate, best, better):
    assert _better(candidate, best, GOAL) is better
