"""Files are ours only when we wrote them: ownership, one writer, a swap that survives a kill
at every step, symlinks, and the user's files inside a bundle."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from vit_deploy.runtime import swap
from vit_deploy.cli import main
from vit_deploy.runtime.contract import MANIFEST_NAME, MODEL_FILE
from vit_deploy.runtime.manifest import load_manifest


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def bundle(tiny_bundle, tmp_path):
    """A private copy of the session's tiny bundle, with a user's files inside it."""
    _, result = tiny_bundle
    b = tmp_path / "b"
    shutil.copytree(result.path, b)
    (b / "notes.txt").write_text("mine")
    (b / "calib").mkdir()
    (b / "calib" / "cat.png").write_bytes(b"not really a png")
    (b / ".ort-cache").mkdir()
    (b / ".ort-cache" / "x.onnx").write_bytes(b"cache")
    return b


def user_files_intact(b: Path) -> bool:
    return ((b / "notes.txt").read_text() == "mine"
            and (b / "calib" / "cat.png").read_bytes() == b"not really a png"
            and (b / ".ort-cache" / "x.onnx").read_bytes() == b"cache")


def siblings(b: Path) -> list[str]:
    return sorted(p.name for p in b.parent.iterdir() if p.name not in (b.name, "elsewhere"))


# -- what counts as ours -------------------------------------------------------------------
@pytest.mark.parametrize("content", [
    {"notes.txt": "x"},
    {MANIFEST_NAME: json.dumps({"name": "someone else's manifest"})},
    {MANIFEST_NAME: "not json at all"},
    {MANIFEST_NAME: json.dumps({"format": "vit-deploy-bundle", "format_version": 2})},
])
def test_a_directory_we_did_not_write_is_refused_by_every_writer(tiny_bundle, tmp_path, content):
    _, result = tiny_bundle
    out = tmp_path / "theirs"
    out.mkdir()
    for name, text in content.items():
        (out / name).write_text(text)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for args in (["export", "--model", "tiny", "--out", out],
                 ["triton", result.path, "--out", out, "--name", "m"]):
        r = run(*args)
        assert r.exit_code == 2, r.output
        assert "--force" in r.output and "Traceback" not in r.output
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_bundle_whose_files_do_not_match_their_hashes_is_not_ours(bundle, tmp_path):
    data = bytearray((bundle / MODEL_FILE).read_bytes())
    data[-1] ^= 1
    (bundle / MODEL_FILE).write_bytes(bytes(data))
    r = run("export", "--model", "tiny", "--out", bundle)
    assert r.exit_code == 2 and "not a bundle vit-deploy wrote" in " ".join(r.output.split())
    assert (bundle / MODEL_FILE).read_bytes() == bytes(data)


def test_force_writes_into_a_foreign_directory_and_keeps_its_files(tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = run("export", "--model", "tiny", "--no-simplify", "--out", out, "--force")
    assert r.exit_code == 0, r.output
    assert (out / "notes.txt").read_text() == "mine"
    load_manifest(out)


@pytest.mark.parametrize("where", ["cwd", "bundle", "parent"])
def test_out_may_not_be_the_bundle_the_cwd_or_a_parent(bundle, where, monkeypatch, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(bundle.parent if where == "cwd" else elsewhere)
    out = {"cwd": Path("."), "bundle": bundle, "parent": bundle.parent}[where]
    r = run("triton", bundle, "--out", out, "--name", "m", "--force")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert user_files_intact(bundle)
    load_manifest(bundle)
    r = run("export", "--model", "tiny", "--out", ".", "--force")
    assert r.exit_code == 2 and "current directory" in r.output
    assert sorted(p.name for p in elsewhere.iterdir()) == []


def test_export_over_our_bundle_keeps_the_users_files(bundle):
    r = run("export", "--model", "tiny", "--pos-embed", "factorized", "--no-simplify",
            "--out", bundle)
    assert r.exit_code == 0, r.output
    assert load_manifest(bundle).config.pos_embed == "factorized"
    assert user_files_intact(bundle)
    assert siblings(bundle) == []


def test_a_user_file_with_a_name_we_write_is_not_overwritten(bundle):
    (bundle / "model.int8.onnx").write_text("the user's own file")
    r = run("quantize", bundle, "--precision", "int8")
    assert r.exit_code == 2 and "was not written by vit-deploy" in " ".join(r.output.split())
    assert (bundle / "model.int8.onnx").read_text() == "the user's own file"
    assert siblings(bundle) == []


# -- rewriting a bundle ------------------------------------------------------------------------
def test_quantize_keeps_every_file_it_did_not_write(bundle):
    r = run("quantize", bundle, "--precision", "int8")
    assert r.exit_code == 0, r.output
    assert set(load_manifest(bundle).models) == {"fp32", "int8"}
    assert user_files_intact(bundle)
    assert siblings(bundle) == []  # no lock, journal or staging left


def test_writing_through_a_symlink_updates_the_target(bundle, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(bundle, target_is_directory=True)
    r = run("quantize", link, "--precision", "int8")
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and link.resolve() == bundle.resolve()
    assert "int8" in load_manifest(bundle).models
    assert user_files_intact(bundle)


def test_a_failed_swap_leaves_the_bundle_and_nothing_beside_it(bundle, monkeypatch):
    before = (bundle / MANIFEST_NAME).read_bytes()

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(bundle))

    monkeypatch.setattr(swap, "swap", refuse)
    r = run("quantize", bundle, "--precision", "int8")
    assert r.exit_code == 1 and "Permission denied" in r.output
    assert (bundle / MANIFEST_NAME).read_bytes() == before
    assert siblings(bundle) == []
    assert user_files_intact(bundle)


# -- two writers -------------------------------------------------------------------------------
HOLD_LOCK = """
import sys
from vit_deploy.runtime.swap import writer_lock
with writer_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_second_writer_fails_with_a_message_while_the_first_holds_the_bundle(bundle):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(bundle)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"  # event-driven: no sleeps
        before = (bundle / MANIFEST_NAME).read_bytes()
        for args in (["quantize", bundle, "--precision", "int8"],
                     ["export", "--model", "tiny", "--out", bundle]):
            r = run(*args)
            assert r.exit_code == 1, r.output
            assert f"pid {holder.pid}" in r.output and "being written" in r.output
        assert (bundle / MANIFEST_NAME).read_bytes() == before
    finally:
        holder.communicate("done\n", timeout=60)
    r = run("quantize", bundle, "--precision", "int8")  # the lock went with its holder
    assert r.exit_code == 0, r.output
    assert siblings(bundle) == []


def test_two_quantize_runs_never_both_succeed_with_a_precision_lost(bundle):
    cmd = [sys.executable, "-m", "vit_deploy.cli", "quantize", str(bundle), "--quiet",
           "--precision"]
    procs = [subprocess.Popen([*cmd, p], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for p in ("int8", "int4")]
    outs = [(p.wait(timeout=300), p.stdout.read()) for p in procs]
    models = set(load_manifest(bundle).models)
    for (code, out), precision in zip(outs, ("int8", "int4")):
        assert code in (0, 1), out
        assert (code == 0) == (precision in models), (precision, out, models)
        if code:
            assert "being written" in out
    assert user_files_intact(bundle)


# -- a kill at every step of the swap ---------------------------------------------------------
REWRITE = """
import os, shutil, signal, sys
from pathlib import Path
from vit_deploy import atomic
from vit_deploy.runtime import swap
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.manifest_parts import FileEntry

bundle, target = Path(sys.argv[1]), sys.argv[2]
swap.step = lambda name: os.kill(os.getpid(), signal.SIGKILL) if name == target else None
manifest = load_manifest(bundle)
with atomic.atomic_directory(bundle) as tmp:
    for name in manifest.files:
        atomic.link_or_copy(bundle / name, tmp / name)
    shutil.copy(bundle / "model.onnx", tmp / "model.int8.onnx")
    manifest.with_precision("int8", "model.int8.onnx",
                            FileEntry.of(tmp / "model.int8.onnx", "model:int8"), {}).save(tmp)
"""
EXCHANGE_STEPS = ["staged", "carried", "journalled", "exchanged", "adopted", "removed-old"]
FALLBACK_STEPS = ["staged", "carried", "journalled", "moved-aside", "moved-in", "adopted",
                  "removed-old"]


@pytest.mark.parametrize("mode,step", [("exchange", s) for s in EXCHANGE_STEPS]
                         + [("fallback", s) for s in FALLBACK_STEPS])
def test_a_kill_at_any_step_leaves_a_valid_bundle_or_one_recovery_restores(bundle, mode, step):
    env = dict(os.environ, VIT_DEPLOY_NO_EXCHANGE="1" if mode == "fallback" else "0")
    p = subprocess.run([sys.executable, "-c", REWRITE, str(bundle), step], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr  # it died exactly there
    if mode == "exchange" or step != "moved-aside":
        assert bundle.is_dir()  # the path holds a complete directory, old or new
    else:
        assert not bundle.exists()  # the one gap of a swap without exchange
    # the next command that opens the bundle (here: a plain read) restores or finishes it
    models = set(load_manifest(bundle).models)
    after_swap = EXCHANGE_STEPS.index(step) >= 3 if mode == "exchange" else \
        FALLBACK_STEPS.index(step) >= 4
    assert models == ({"fp32", "int8"} if after_swap else {"fp32"})
    assert user_files_intact(bundle)
    assert siblings(bundle) == []
    with swap.writer_lock(bundle) as resolved:  # a writer finds nothing left to do
        swap.recover(resolved)
    assert set(load_manifest(bundle).models) == models and siblings(bundle) == []
