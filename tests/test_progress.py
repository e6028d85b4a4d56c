"""Saying what is happening (vit_deploy/progress.py): a long step is never silent."""

from __future__ import annotations

import time

from vit_deploy.progress import steps


def test_a_long_step_is_said_again_while_it_runs(capsys):
    with steps(heartbeat=0.2) as progress:  # not a terminal here: plain lines on stderr
        progress("running the fp32 reference")
        time.sleep(0.75)
        progress("int8: quantising")
        time.sleep(0.1)
    lines = capsys.readouterr().err.splitlines()
    assert "running the fp32 reference" in lines[0]
    still = [line for line in lines if "still: running the fp32 reference" in line]
    assert 2 <= len(still) <= 4 and "s in this step)" in still[0], lines
    assert "int8: quantising" in lines[-1]  # a step shorter than the heartbeat: said once
    time.sleep(0.5)  # the heartbeat stopped with the block: nothing more is said
    assert capsys.readouterr().err == ""


def test_quiet_says_nothing(capsys):
    with steps(quiet=True, heartbeat=0.05) as progress:
        progress("working")
        time.sleep(0.2)
    assert capsys.readouterr().err == ""
