"""The README's commands, as a new user runs them."""

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vit_deploy.export.checkpoints import load_model
from vit_deploy.cli import main
from vit_deploy.runtime.contract import WEIGHTS_FILE
from vit_deploy.parity import judge, sample_inputs
from vit_deploy.runtime import ViTSession

ROOT = Path(__file__).resolve().parents[1]


def _first_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()[:12]
    return [m.group(1).strip() for line in lines if (m := re.match(r"^\s*\$?\s*(make \w+)", line))]


def _make_export_args() -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    args = re.search(r"^ARGS \?= (.*)$", makefile, re.M).group(1)
    recipe = re.search(r"^export:.*\n\t(.*)$", makefile, re.M).group(1)
    assert recipe.strip() == "$(BIN)/vit-deploy export $(ARGS)"
    return shlex.split(args)


def test_readme_starts_with_the_two_commands():
    assert _first_commands()[:2] == ["make export", "make test"]
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")


def test_the_docs_start_where_the_readme_does():
    """docs/getting-started.md opens with the README's two commands and the sentence on what
    they set up, word for word; the README's tour shows the command `make export` runs."""
    readme = (ROOT / "README.md").read_text()
    start = readme[readme.index("    make export"):readme.index("\n\n", readme.index("Both work"))]
    assert start in (ROOT / "docs" / "getting-started.md").read_text()
    shown = re.search(r"^\s*vit-deploy export (.*?)\s+# what make export runs$", readme, re.M)
    assert shown and shlex.split(shown.group(1)) == _make_export_args()


@pytest.mark.slow
def test_readme_export_command_gives_a_bundle_that_runs_at_any_resolution(tmp_path):
    args = _make_export_args()
    assert args == ["--patch", "16", "--res", "448"]
    out = tmp_path / "bundle"
    r = CliRunner().invoke(main, ["export", *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "parity: PASS" in r.output
    import torch

    model = load_model(out / WEIGHTS_FILE)
    assert model.cfg.name == "B/16"
    # the export checked 6 sizes itself; here the written bundle, through the public API, at
    # the deploy size and a small non-square one
    with ViTSession(out) as session:
        for hw in [(448, 448), (32, 64)]:
            x = sample_inputs(hw, 1, seed=3)
            with torch.no_grad():
                ref = model(torch.from_numpy(x)).numpy()
            case = judge(ref, session.run(x), resolution=hw, provider="cpu")
            assert case.passed, case
            assert np.isfinite(ref).all()
