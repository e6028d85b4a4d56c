"""The command line loads a command only when it runs (or --help lists it): `vit-deploy
--help` and `vit-deploy predict` import neither torch nor the server (FastAPI, uvicorn),
each checked in a fresh interpreter."""

import json
import subprocess
import sys

import click
import numpy as np
import pytest
from PIL import Image

from vit_deploy.cli import main
from vit_deploy.cli.group import COMMANDS

# Runs the CLI in this interpreter, then says what it loaded.
_RUN_AND_REPORT = """
import json, sys
from vit_deploy.cli import main
try:
    code = main(sys.argv[1:], prog_name="vit-deploy", standalone_mode=False)
except SystemExit as e:
    code = e.code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "fastapi", "uvicorn",
                "starlette", "matplotlib") or m.startswith(("vit_deploy.export",
                "vit_deploy.serve", "vit_deploy.cli.")))
print("LOADED " + json.dumps({"code": code or 0, "modules": loaded}))
"""
HEAVY = ("torch", "fastapi", "uvicorn", "starlette", "matplotlib", "vit_deploy.export",
         "vit_deploy.serve")


def run_fresh(*args, cwd=None) -> tuple[str, dict]:
    done = subprocess.run([sys.executable, "-c", _RUN_AND_REPORT, *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    out, _, report = done.stdout.rpartition("LOADED ")
    return out, json.loads(report)


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]


def test_help_lists_every_command_with_its_help_and_imports_nothing_heavy():
    out, report = run_fresh("--help")
    assert report["code"] == 0 and heavy(report["modules"]) == []
    ctx = click.Context(main, info_name="vit-deploy")
    listed = {line.split()[0]: line for line in out.split("Commands:")[1].splitlines()
              if line.strip()}
    assert sorted(listed) == sorted(main.list_commands(ctx)) == sorted(COMMANDS)
    for name in COMMANDS:
        first_words = " ".join(main.get_command(ctx, name).help.split()[:3])
        assert first_words in " ".join(listed[name].split()), (name, listed[name])


def test_predict_imports_neither_torch_nor_the_server_nor_other_commands(quantised_bundle,
                                                                         tmp_path):
    image = tmp_path / "cat.png"
    Image.fromarray(np.full((40, 50, 3), 128, np.uint8)).save(image)
    out, report = run_fresh("predict", quantised_bundle, image, "--json", "--top-k", "2")
    assert report["code"] == 0, out
    assert json.loads(out)["providers"][0] == "cpu"
    assert heavy(report["modules"]) == []
    # only the command that ran was imported (plus the shared options, parameter types
    # and the group; the vocabulary only where an option is unknown)
    commands = {m.split(".")[2] for m in report["modules"] if m.startswith("vit_deploy.cli.")}
    assert commands == {"predict", "options", "params", "group"}


@pytest.mark.parametrize("args", [["serve", "--help"], ["bench", "--help"], ["info", "{b}"]],
                         ids=["serve-help", "bench-help", "info"])
def test_other_torch_free_paths_stay_light(quantised_bundle, args):
    out, report = run_fresh(*[a.format(b=quantised_bundle) for a in args])
    assert report["code"] == 0, out
    assert heavy(report["modules"]) == []


def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "vit_deploy.cli", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "version" in done.stdout, done.stderr
