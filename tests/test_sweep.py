"""`vit-deploy sweep`: patch size × token merging × precision, scored and timed."""

import json

import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.data import DIGITS_MODEL_FILE, DIGITS_RECORD_FILE, data_path
from vit_deploy.sweep import SweepPoint, SweepReport, parse_list


def test_sweep_of_the_trained_model(tmp_path):
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    r = CliRunner().invoke(main, [
        "sweep", str(data_path(DIGITS_MODEL_FILE)), "--patch", "8,16", "--merge-tokens", "0,2",
        "--eval-set", "digits", "--rounds", "1", "--runs", "3", "--budget-ms", "1000",
        "--json", str(out), "--plot", str(plot), "--quiet"])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    points = {p["label"]: p for p in report["points"]}
    assert set(points) == {"P8 r0 fp32", "P8 r2 fp32", "P16 r0 fp32", "P16 r2 fp32"}
    # 32x32 at patch 16 is 4 patches: each block merges what its tokens allow (ToMe's
    # clamp, min(2, (T - 1) // 2)): 2, 1, then none; nothing is skipped
    assert report["skipped"] == []
    assert points["P16 r2 fp32"]["tokens"] == 4 and points["P16 r2 fp32"]["tokens_last"] == 1
    base = points["P8 r0 fp32"]
    recorded = json.loads(data_path(DIGITS_RECORD_FILE).read_text())["held_out_accuracy"]
    assert base["score"] == pytest.approx(recorded * 100, abs=0.3)  # the training script's
    assert base["cosine_min"] > 0.99999 and base["tokens"] == 16 and base["tokens_last"] == 16
    merged = points["P8 r2 fp32"]
    assert merged["tokens_last"] == 16 - 2 * 3 and merged["cosine_min"] < 0.9999
    assert merged["cosine_min"] <= merged["cosine"] <= 1
    assert points["P16 r0 fp32"]["tokens"] == 4
    assert all(p["provider"] == "cpu" and p["p90_ms"] >= p["p50_ms"] > 0 for p in points.values())
    assert report["best_under_budget"] in points and report["pareto"]
    assert plot.read_bytes()[:4] == b"\x89PNG"


def _point(label, score, p90):
    patch, merge, precision = label.split()
    return SweepPoint(patch=int(patch[1:]), merge=[int(merge[1:])] * 2, precision=precision,
                      tokens=16, tokens_last=16, score=score, cosine=1.0, cosine_min=1.0,
                      passed=True,
                      p50_ms=p90 / 2, p90_ms=p90)


def test_pareto_front_and_budget():
    pts = [_point("P8 r0 fp32", 95.0, 10.0), _point("P8 r2 fp32", 94.0, 6.0),
           _point("P16 r0 fp32", 80.0, 7.0),  # slower and worse than P8 r2: dominated
           _point("P16 r2 int8", 70.0, 2.0)]
    report = SweepReport(checkpoint="x", resolution=(32, 32), metric="accuracy", points=pts,
                         options={})
    assert [p.label for p in report.pareto()] == ["P16 r2 int8", "P8 r2 fp32", "P8 r0 fp32"]
    assert report.best_under(6.5).label == "P8 r2 fp32"
    assert report.best_under(1.0) is None


def test_bad_sweep_requests_are_refused(tmp_path):
    ckpt = str(data_path(DIGITS_MODEL_FILE))
    for args, message in [(["--merge-tokens", "2,x"], "comma-separated"),
                          (["--merge-tokens", "1,2;3"], "one number of tokens merged per block"),
                          (["--patch", "8,big"], "list of ints"),
                          (["--res", "32x48", "--eval-set", "digits"], "square")]:
        r = CliRunner().invoke(main, ["sweep", ckpt, *args, "--quiet"])
        assert r.exit_code == 2 and message in r.output, (args, r.output)
    assert parse_list("0;4,4,2,2") == ("0", "4,4,2,2")
    assert parse_list("8,16", int) == (8, 16)


def test_timing_rounds_interleave_the_configurations_and_keep_each_rounds_median(monkeypatch):
    """Rounds go A B C, A B C (drift hits every configuration alike); p50 is the median of
    the rounds' p50s, p90 the worst round's; each round is its own `bench` process."""
    from pathlib import Path

    from vit_deploy import sweep

    calls = []
    p50s = {"a": [3.0, 1.0, 2.0], "b": [5.0, 6.0, 4.0]}

    def bench_once(bundle, precision, res, options):
        calls.append(bundle.name)
        i = sum(c == bundle.name for c in calls) - 1
        return {"provider": "cpu", "p50_ms": p50s[bundle.name][i],
                "p90_ms": p50s[bundle.name][i] + i}

    monkeypatch.setattr(sweep, "_bench_once", bench_once)
    points = [(SweepPoint(patch=8, merge=[0], precision="fp32", tokens=16, tokens_last=16,
                          score=1.0, cosine=1.0, cosine_min=1.0, passed=True), Path(n))
              for n in ("a", "b")]
    sweep._time(points, (32, 32), sweep.SweepOptions(rounds=3), lambda _: None)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    (a, _), (b, _) = points
    assert a.rounds_p50_ms == [3.0, 1.0, 2.0] and a.p50_ms == 2.0 and a.p90_ms == 4.0  # 3, 2, 4
    assert b.p50_ms == 5.0 and b.p90_ms == 7.0 and a.provider == b.provider == "cpu"
