"""--pool and --pos-embed build a new model; with a checkpoint, which brings its own, a
value given on the command line that differs from the checkpoint's is refused (exit 2, one
line naming both); it was silently not applied. The checkpoint's own value is accepted."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.export.checkpoints import save_weights


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, make_tiny):  # the tiny model: learned positions, cls pooling
    return save_weights(make_tiny(), tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")


@pytest.mark.parametrize("flag, value, own", [
    ("--pool", "mean", "cls"), ("--pool", "map", "cls"),
    ("--pos-embed", "factorized", "learned"), ("--pos-embed", "rope", "learned")])
def test_a_flag_the_checkpoint_overrides_is_refused(checkpoint, tmp_path, flag, value, own):
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(checkpoint), flag, value,
                                  "--res", "32", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert f"{flag} {value}" in r.output and f"({own})" in r.output, r.output
    assert "Traceback" not in r.output and not out.exists()


def test_the_checkpoints_own_value_is_accepted(checkpoint, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(checkpoint), "--pool", "cls",
                                  "--pos-embed", "learned", "--res", "32", "--no-simplify",
                                  "--out", str(out), "--quiet"])
    assert r.exit_code == 0 and (out / "manifest.json").is_file(), r.output
