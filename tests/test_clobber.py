"""Nothing lost: a path the user names for a command's output never lands inside a bundle
the command reads or on one of its inputs, however it is spelled (symlinks, hard links,
`..`, relative paths), --force or not. One guard (`atomic.refuse_clobber`) serves every
command; each refusal is a usage error (exit 2) naming what would have been overwritten."""

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from vit_deploy.atomic import ClobberError, refuse_clobber
from vit_deploy.cli import main
from vit_deploy.export.bundle import ExportOptions, export_bundle


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def dense_bundle(make_tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dense") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(simplify=False,
                                                          outputs=("logits", "patch_tokens")))
    return out


@pytest.fixture
def world(dense_bundle, tmp_path):
    """A private bundle and two input images, side by side in tmp_path."""
    b = tmp_path / "b"
    shutil.copytree(dense_bundle, b)
    (b / "calib").mkdir()
    (b / "calib" / "cat.png").write_bytes(b"a user's file")
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for name in ("cat.png", "dog.png"):
        Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(images / name)
    return b, images / "cat.png", images / "dog.png"


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file under the roots (and beside them), by path: its sha256."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for root in roots for p in sorted(root.parent.rglob("*"))
            if p.is_file() and not p.is_symlink()}


# name -> (how to make the output path from (tmp_path, bundle, image1, image2),
#          what the message must name)
def _link(path: Path, to: Path, hard: bool = False) -> Path:
    (os.link if hard else os.symlink)(to, path)
    return path


PREDICT_CASES = {
    "new file inside the bundle": (lambda t, b, i, j: b / "feat.npz", "inside the bundle"),
    "in a folder of the bundle": (lambda t, b, i, j: b / "calib" / "f.npz", "inside the bundle"),
    "the model file": (lambda t, b, i, j: b / "model.onnx", "inside the bundle"),
    "the manifest": (lambda t, b, i, j: b / "manifest.json", "inside the bundle"),
    "the model through ..": (lambda t, b, i, j: Path(f"{b}/../b/./model.onnx"),
                             "inside the bundle"),
    "a symlink to the model": (lambda t, b, i, j: _link(t / "f.npz", b / "model.onnx"),
                               "inside the bundle"),
    "through a symlinked folder": (lambda t, b, i, j: _link(t / "bl", b) / "f.npz",
                                   "inside the bundle"),
    "a hard link to the model": (lambda t, b, i, j: _link(t / "f.npz", b / "model.onnx",
                                                          hard=True), "model.onnx"),
    "the input image": (lambda t, b, i, j: i, "cat.png"),
    "the second input image": (lambda t, b, i, j: j, "dog.png"),
    "a symlink to the image": (lambda t, b, i, j: _link(t / "f.npz", i), "cat.png"),
    "a hard link to the image": (lambda t, b, i, j: _link(t / "f.npz", i, hard=True),
                                 "cat.png"),
    "the image through ..": (lambda t, b, i, j: i.parent / ".." / "images" / i.name,
                             "cat.png"),
}


@pytest.mark.parametrize("force", [True, False], ids=["force", "no-force"])
@pytest.mark.parametrize("case", PREDICT_CASES)
def test_predict_features_never_overwrites_the_bundle_or_an_input(world, tmp_path, case, force):
    b, cat, dog = world
    make, named = PREDICT_CASES[case]
    out = make(tmp_path, b, cat, dog)
    before = snapshot(b, cat)
    entries = sorted(os.listdir(b))
    r = run("predict", b, cat, dog, "--features", out, *(["--force"] if force else []))
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "--features" in r.output and named in r.output, r.output
    assert snapshot(b, cat) == before  # not one byte of the bundle or the images changed
    assert sorted(os.listdir(b)) == entries  # and nothing new inside the bundle


@pytest.mark.parametrize("spelling", ["relative", "dot-relative"])
def test_relative_spellings_of_an_input_are_the_input(world, monkeypatch, spelling):
    b, cat, dog = world
    monkeypatch.chdir(cat.parent)
    out = {"relative": "cat.png", "dot-relative": "./sub/../cat.png"}[spelling]
    (cat.parent / "sub").mkdir()
    before = cat.read_bytes()
    r = run("predict", b, "cat.png", "--features", out, "--force")
    assert r.exit_code == 2 and "the input 'cat.png'" in r.output, r.output
    assert cat.read_bytes() == before


def test_a_bare_onnx_file_is_an_input(world, tmp_path):
    b, cat, _ = world
    model = tmp_path / "m.onnx"
    shutil.copy(b / "model.onnx", model)
    before = model.read_bytes()
    r = run("predict", model, cat, "--res", "32", "--features", model, "--force")
    assert r.exit_code == 2 and "m.onnx" in r.output, r.output
    assert model.read_bytes() == before


@pytest.mark.parametrize("where", ["the bundle", "its parent"])
def test_a_folder_as_features_is_refused(world, where):
    b, cat, _ = world
    out = b if where == "the bundle" else b.parent
    r = run("predict", b, cat, "--features", out, "--force")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output


def test_features_beside_the_bundle_and_over_an_unrelated_file_are_written(world, tmp_path):
    b, cat, dog = world
    for out in (tmp_path / "f.npz", tmp_path / "b-features" / "f.npz", tmp_path / "bb.npz"):
        out.parent.mkdir(exist_ok=True)
        r = run("predict", b, cat, dog, "--features", out)
        assert r.exit_code == 0, r.output
        assert sorted(np.load(out).files) == ["patch_tokens_0", "patch_tokens_1", "sources"]
    old = tmp_path / "old.npz"
    old.write_bytes(b"an earlier run")
    r = run("predict", b, cat, "--features", old)
    assert r.exit_code == 2 and "exists; pass --force" in r.output
    r = run("predict", b, cat, "--features", old, "--force")
    assert r.exit_code == 0 and "patch_tokens_0" in np.load(old).files


# -- the other commands that write a file or folder the user names -------------------------
OTHER_CASES = {
    "check --json in the bundle": (["check", "{b}", "--json", "{b}/report.json"], "--json"),
    "check --markdown over the model": (["check", "{b}", "--markdown", "{b}/model.onnx"],
                                        "--markdown"),
    "check --json through a link": (["check", "{b}", "--json", "{t}/link/r.json"], "--json"),
    "bench --json in the bundle": (["bench", "{b}", "--json", "{b}/r.json"], "--json"),
    "bench --csv over the manifest": (["bench", "{b}", "--csv", "{b}/manifest.json"], "--csv"),
    "bench --plot in the bundle": (["bench", "{b}", "--plot", "{b}/p.png"], "--plot"),
    "bench --json over a compared report": (["bench", "--compare", "{t}/r.json", "--json",
                                             "{t}/r.json"], "the input"),
    "triton --out in the bundle": (["triton", "{b}", "--out", "{b}/repo", "--force"], "--out"),
    "triton --out the bundle's parent": (["triton", "{b}", "--out", "{t}", "--force"],
                                         "holding the bundle"),
    "web --out in the bundle": (["web", "{b}", "--out", "{b}/site", "--force"], "--out"),
    "web --out through a link": (["web", "{b}", "--out", "{t}/link/site", "--force"], "--out"),
    "sweep --json over the checkpoint": (["sweep", "{t}/ckpt.safetensors", "--json",
                                          "{t}/ckpt.safetensors"], "the input"),
    "sweep --plot in a checkpoint folder": (["sweep", "{t}/hf", "--plot", "{t}/hf/p.png"],
                                            "inside the bundle"),
}


@pytest.mark.parametrize("case", OTHER_CASES)
def test_every_command_refuses_an_output_over_what_it_reads(world, tmp_path, case):
    b, _, _ = world
    args, named = OTHER_CASES[case]
    (tmp_path / "link").symlink_to(b, target_is_directory=True)
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "ckpt.safetensors").write_bytes(b"weights")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    before = snapshot(b)
    entries = sorted(os.listdir(b))
    r = run(*[a.format(b=b, t=tmp_path) for a in args])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert named in r.output, r.output
    assert snapshot(b) == before and sorted(os.listdir(b)) == entries
    assert (tmp_path / "r.json").read_text() == "{}"
    assert (tmp_path / "ckpt.safetensors").read_bytes() == b"weights"


# -- the guard itself ----------------------------------------------------------------------
def test_the_guard_allows_what_touches_no_input(world, tmp_path):
    b, cat, _ = world
    for out in (tmp_path / "x.npz", tmp_path / "images" / "new.npz", tmp_path / "b2" / "x",
                tmp_path / ".b.npz"):
        refuse_clobber(out, option="--x", bundles=[b, tmp_path / "missing"], inputs=[cat])
    with pytest.raises(ClobberError, match=r"--x '.*model.onnx' is inside the bundle"):
        refuse_clobber(b / "model.onnx", option="--x", bundles=[tmp_path / "missing", b])
    assert issubclass(ClobberError, FileExistsError)  # the CLI maps it to exit 2
