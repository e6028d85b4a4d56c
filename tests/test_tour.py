"""The README's tour, followed in order as a new user would after `make export`: every
command line, the Python snippet and the JavaScript one run on a CPU-only machine, with the
images the package ships. ViT-B/16 lines run on the tiny model with the same flags (the
bundle keeps the README's name), the sweep runs the corners of its grid and times one round
instead of three; a few lines cannot run here and say why below."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from snippets import snippets

ROOT = Path(__file__).resolve().parents[1]

# Lines that cannot run on a CPU-only machine without a network, and where they are tested
NOT_HERE = {
    "--checkpoint": "downloads or needs a checkpoint: tests/export/test_hub.py, test_checkpoints.py",
    "vit-deploy serve": "a server that runs until stopped: tests/serve/test_server.py",
    "examples/oip_client.py": "needs the server above: tests/serve/test_server_v2.py",
    "vit-deploy embed": "needs a Ray cluster (--ray auto): tests/serve/test_ray.py",
}


def tour() -> list[tuple[str, str]]:
    """[(kind, text)] of the tour in order: 'shell' lines (continuations joined, trailing
    comments dropped), 'python' and 'js' fenced blocks (tests/snippets.py reads them)."""
    text = (ROOT / "README.md").read_text()
    text = text[text.index("## A short tour"):text.index("## Headline numbers")]
    steps = snippets(text)
    assert all(s.kind in ("shell", "python", "js") for s in steps), steps
    return [(s.kind, s.text) for s in steps]


def test_the_tour_reads_as_the_test_runs_it():
    steps = tour()
    shell = [t for k, t in steps if k == "shell"]
    assert shell[0] == "vit-deploy export --patch 16 --res 448"
    assert [k for k, _ in steps].count("python") == 1 and [k for k, _ in steps].count("js") == 1
    assert any(t.startswith("vit-deploy quantize vit-B16-448") for t in shell)
    # the first line that needs int8 comes after the line that adds it
    first_int8 = min(i for i, t in enumerate(shell) if "int8" in t and "quantize" not in t)
    assert first_int8 > next(i for i, t in enumerate(shell) if t.startswith("vit-deploy quantize"))


def _argv(cmd: str) -> list[str] | None:
    if any(mark in cmd for mark in NOT_HERE):
        return None
    argv = shlex.split(cmd)
    if argv[:2] == ["vit-deploy", "export"]:  # what make export runs, on the tiny model
        argv += ["--model", "tiny", "--out", "vit-B16-448"]
    if argv[:2] == ["vit-deploy", "sweep"]:
        argv = [*_corners(argv), "--rounds", "1"]
    if argv[:2] == ["vit-deploy", "web"]:
        argv = [a for a in argv if a != "--serve"]  # serving is tested in tests/website/test_web.py
    if argv[0] == "vit-deploy":
        return [sys.executable, "-m", "vit_deploy.cli", *argv[1:]]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return argv


def _corners(argv: list[str]) -> list[str]:
    """The sweep's grid cut to its corners (the first and last patch size and merge amount):
    the same loops, exports and Pareto front on 4 configurations instead of 9; each one is a
    torch.onnx.export of a token-merging graph (5-10 s on a loaded core: 9 of them were half
    the test). One timing round, not three: rounds repeat the same code path
    (tests/test_sweep.py times rounds)."""
    out = list(argv)
    for flag in ("--patch", "--merge-tokens"):
        values = out[out.index(flag) + 1].split(",")
        out[out.index(flag) + 1] = ",".join([values[0], values[-1]] if len(values) > 2 else values)
    return out


def test_the_sweep_line_runs_on_the_corners_of_its_grid():
    line = next(t for k, t in tour() if k == "shell" and t.startswith("vit-deploy sweep"))
    argv = _argv(line)
    assert argv[argv.index("--patch") + 1] == "8,32"
    assert argv[argv.index("--merge-tokens") + 1] == "0,12"
    assert argv[-2:] == ["--rounds", "1"] and "--budget-ms" in argv


@pytest.mark.heavy
def test_every_line_of_the_tour_runs_in_order(tmp_path):
    for name in ("vit_deploy", "examples", "node_modules"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    ran = []
    for kind, text in tour():
        if kind == "shell":
            argv = _argv(text)
            if argv is None:
                continue
        elif kind == "python":
            argv = [sys.executable, "-c", text]
        else:
            argv = ["node", "--input-type=module", "-e", text + "\nconsole.log(top[0].label ?? top[0].index);"]
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=900)  # a loaded 2-core machine: the sweep line took > 600 s
        if text.startswith("vit-deploy target") and r.returncode == 1:
            # the tiny stand-in's dynamic int8 misses the int8 policy on noise at 224
            # (cosine 0.987; ViT-B/16 passes): reported, that graph left out, the rest written
            assert "int8: outside the tolerance policy" in r.stderr + r.stdout, r.stderr[-2000:]
            assert "writing target mobile" in r.stderr + r.stdout
        else:
            assert r.returncode == 0, f"{text}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        assert "Traceback" not in r.stderr, text
        ran.append(text)
    assert len(ran) >= 15, ran
    assert (tmp_path / "vit-B16-448" / "model.int8.onnx").is_file()
    assert (tmp_path / "report.md").is_file() and (tmp_path / "node.json").is_file()
    assert (tmp_path / "site").is_dir() and (tmp_path / "repo").is_dir()
