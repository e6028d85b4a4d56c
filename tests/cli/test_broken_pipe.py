"""A reader that goes away (`vit-deploy ... | head -1`) ends a command quietly: exit 1, as
click's own, and nothing on stderr (it printed 'Error: Broken pipe', and the interpreter
'Exception ignored ... BrokenPipeError')."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vit_deploy.export.bundle import ExportOptions, export_bundle

PHOTO = Path(__file__).resolve().parents[2] / "vit_deploy" / "data" / "photos" / "eval-chelsea.jpg"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, make_tiny):
    out = tmp_path_factory.mktemp("pipe") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(resolution=(32, 32), simplify=False))
    return out


@pytest.mark.parametrize("argv", [["--help"], ["info", "{b}"], ["info", "{b}", "--json"],
                                  ["predict", "{b}", str(PHOTO)],
                                  ["predict", "{b}", str(PHOTO), "--quiet", "--top-k", "10"],
                                  ["providers"]])
def test_a_closed_pipe_ends_the_command_quietly(bundle, argv):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        r = subprocess.run([sys.executable, "-m", "vit_deploy.cli",
                            *(a.format(b=bundle) for a in argv)],
                           stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert r.returncode == 1 and r.stderr == "", (r.returncode, r.stderr[-1000:])
