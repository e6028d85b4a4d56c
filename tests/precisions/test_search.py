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


def test_the_folds_split_by_photograph_so_no_crop_is_scored_where_it_was_fitted():
    import numpy as np

    from vit_deploy.precisions.evaluate import Calibration
    from vit_deploy.precisions.search import folds

    # two batches of two photographs, each whole and two crops (3 views); image value = photo
    calibration = Calibration([np.repeat(np.arange(a, a + 2), 3).astype(np.float32)
                               .reshape(6, 1, 1, 1) for a in (0, 2)])
    calibration.framings = 3
    fit, judge = folds(calibration)
    fitted = {int(v) for x in fit for v in x.ravel()}
    scored = {int(v) for x in judge for v in x.ravel()}
    assert fitted == {0, 2} and scored == {1, 3} and judge.framings == 3
    plain = [np.arange(4, dtype=np.float32).reshape(4, 1, 1, 1)]  # a list: image by image
    fit, judge = folds(plain)
    assert fit[0].ravel().tolist() == [0, 2] and judge[0].ravel().tolist() == [1, 3]


def test_a_failed_verdict_sends_the_search_on_with_a_raised_target(tmp_path, monkeypatch,
                                                                  make_tiny):
    """The search's first choice fails the verdict (made to, here): the search goes on from
    where it stopped, its target raised by the shortfall, and the record says so."""
    import dataclasses

    import vit_deploy.precisions.add as add
    from vit_deploy.export.bundle import ExportOptions, export_bundle
    from vit_deploy.precisions.add import PrecisionOptions, add_precisions
    from vit_deploy.precisions.search import RecipeSearch

    bundle = tmp_path / "b"
    export_bundle(make_tiny(), bundle, options=ExportOptions(resolution=(32, 48)))
    real, margins = add._measure, []
    monkeypatch.setattr(RecipeSearch, "run", lambda self, margin=0.0, _run=RecipeSearch.run:
                        margins.append(margin) or _run(self, margin))

    def failing_once(evaluator, path, precision, recipe):
        result = real(evaluator, path, precision, recipe)
        if len(margins) == 1:  # the first verdict: 0.002 under the floor
            result.photos = [dataclasses.replace(c, cosine_min=c.floor - 0.002, passed=False)
                             for c in result.photos]
            result.passed = False
        return result

    monkeypatch.setattr(add, "_measure", failing_once)
    [r] = add_precisions(bundle, ["int8"], options=PrecisionOptions())
    search = r.recipe["search"]
    first = search["steps"][0]  # every layer quantised met the first target
    assert first["meets_target"] and first["target_expected"] == pytest.approx(0.99)
    # the second target: 0.002 over what the first choice was expected to reach
    assert margins[:2] == search["margins"][:2] == [0.0, pytest.approx(
        first["expected"] + 0.002 - 0.99, abs=1e-6)]
    assert search["verdicts"][0]["shortfall"] == 0.002 and search["verdicts"][0]["margin"] == 0.0
    assert len(search["steps"]) > 1 and not search["steps"][1]["target_expected"] == 0.99
    assert r.passed and any("failed verdict" in n for n in r.notes), r.notes
