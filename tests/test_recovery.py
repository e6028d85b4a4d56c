"""Nothing left behind: a writer (`quantize`, `target`) SIGKILLed at any point leaves
staging, a journal or a bundle moved aside; every command that opens the bundle afterwards
finishes or undoes the interrupted swap and removes the dead writer's staging, while a
live writer's staging (its lock held) is never touched."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from vit_deploy.cli import main
from vit_deploy.runtime import swap
from vit_deploy.runtime.files import sha256_file
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.manifest import load_manifest


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def siblings(b: Path) -> list[str]:
    """Everything beside the bundle: staging, journals, old versions, lock files."""
    return sorted(p.name for p in b.parent.iterdir() if p.name != b.name)


def _copy(base: Path, tmp_path: Path) -> Path:
    """A private copy of the bundle, alone in its folder."""
    b = tmp_path / "root" / "b"
    shutil.copytree(base, b)
    return b


def user_files_intact(b: Path) -> bool:
    return ((b / "notes.txt").read_text() == "mine"
            and (b / "calib" / "cat.png").read_bytes() == b"not really a png")


@pytest.fixture(scope="module")
def base(make_tiny, tmp_path_factory) -> Path:
    """A tiny bundle with weights (for `target`), dense outputs (for predict --features)
    and a user's files inside it."""
    out = tmp_path_factory.mktemp("base") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(simplify=False,
                                                          outputs=("logits", "patch_tokens")))
    (out / "notes.txt").write_text("mine")
    (out / "calib").mkdir()
    (out / "calib" / "cat.png").write_bytes(b"not really a png")
    return out


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("images") / "cat.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(path)
    return path


# -- killed writers ------------------------------------------------------------------------
# The CLI in a child that SIGKILLs itself at a named point: inside the work (after the
# first file is in the staging directory) or at a step of the swap (swap.step). The kill
# lands exactly there whatever the machine's load; the timeout only bounds a hung child.
KILLED = """
import os, signal, sys
from vit_deploy.cli import main
from vit_deploy.runtime import swap

command, point, bundle = sys.argv[1:4]
die = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
if point == "working":
    if command == "quantize":
        import vit_deploy.precisions.add as module
        name = "quantize_model"
    else:
        import vit_deploy.export.static as module
        name = "export_static"
    real = getattr(module, name)
    setattr(module, name, lambda *a, **k: (real(*a, **k), die()))
else:
    swap.step = lambda step: die() if step == point else None
args = {"quantize": ["--precision", "int8"],
        "target": ["--target", "cpu", "--buckets", "32"]}[command]
main([command, bundle, "--quiet", *args])
"""

# name: (command, kill point, exchange?, the swap happened?)
STATES = {
    "quantize-working": ("quantize", "working", True, False),
    "quantize-journalled": ("quantize", "journalled", False, False),
    "quantize-moved-aside": ("quantize", "moved-aside", False, False),
    "quantize-moved-in": ("quantize", "moved-in", False, True),
    "quantize-exchanged": ("quantize", "exchanged", True, True),
    "quantize-adopted": ("quantize", "adopted", True, True),
    "target-working": ("target", "working", True, False),
    "target-moved-aside": ("target", "moved-aside", False, False),
}


def _killed_state(base: Path, root: Path, name: str) -> Path:
    command, point, exchange, _ = STATES[name]
    b = root / "b"
    shutil.copytree(base, b)
    env = dict(os.environ, VIT_DEPLOY_NO_EXCHANGE="0" if exchange else "1")
    p = subprocess.run([sys.executable, "-c", KILLED, command, point, str(b)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr  # it died exactly there
    left = siblings(b)
    assert left, f"{name}: the killed writer left nothing to recover"
    if point == "working":  # its staging, with the file it was writing
        staging = [root / n for n in left if n.startswith(".b.tmp-")]
        assert len(staging) == 1 and any(staging[0].rglob("*.onnx")), left
    if point == "moved-aside":  # the kill between the two renames: no bundle at the path
        assert not b.exists()
    return b


@pytest.fixture(scope="module")
def killed(base, tmp_path_factory):
    """name -> a folder holding what a writer SIGKILLed at that point left (made once)."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = _killed_state(base, tmp_path_factory.mktemp(name), name).parent
        return made[name]
    return get


def _legacy(base: Path, root: Path) -> Path:
    """What an older vit-deploy's killed quantize / target left: `.q-` / `.t-` staging
    (tempfile names), a journal being written, and the dead writer's lock file."""
    b = root / "b"
    shutil.copytree(base, b)
    for prefix in (".b.q-", ".b.t-"):
        d = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        (d / "model.int8.onnx").write_bytes(b"partial")
    fd, _ = tempfile.mkstemp(prefix=".b.swap.json.tmp-", dir=root)
    os.close(fd)
    (root / ".b.lock").write_text("vit-deploy (pid 999999)")
    return b


# -- every command that opens a bundle -----------------------------------------------------
def _cli(*args):
    def go(b: Path, out: Path, image: Path) -> None:
        r = run(*[a.format(b=b, out=out, image=image) for a in args])
        assert r.exit_code == 0, r.output
    return go


def _serve_loader(b: Path, out: Path, image: Path) -> None:
    from vit_deploy.serve.app import make_app  # what `vit-deploy serve` does before binding

    with ViTSession(b) as session:
        make_app(session)


def _runtime(b: Path, out: Path, image: Path) -> None:
    with ViTSession(b) as session:  # the torch-free runtime as an app embeds it
        assert session.predict([image])


OPENERS = {
    "info": _cli("info", "{b}"),
    "info-no-verify": _cli("info", "{b}", "--no-verify"),
    "predict": _cli("predict", "{b}", "{image}"),
    "predict-features": _cli("predict", "{b}", "{image}", "--features", "{out}/f.npz"),
    "triton": _cli("triton", "{b}", "--out", "{out}/repo"),
    "web": _cli("web", "{b}", "--out", "{out}/site"),
    "serve-loader": _serve_loader,
    "runtime": _runtime,
    "load_manifest": lambda b, out, image: load_manifest(b),
    "check": _cli("check", "{b}", "--precision", "fp32", "--res", "32", "--batch", "1", "-q"),
    "bench": _cli("bench", "{b}", "--res", "32", "--batch", "1", "--runs", "1", "--warmup", "0",
                  "--sessions", "1"),
    "quantize": _cli("quantize", "{b}", "--precision", "int4", "-q"),
    "target": _cli("target", "{b}", "--target", "cpu", "--buckets", "16", "-q"),
}
CASES = [(s, o) for s in [*STATES, "legacy"] for o in OPENERS]


@pytest.mark.parametrize("state,opener", CASES)
def test_every_command_that_opens_a_bundle_recovers_what_a_killed_writer_left(
        state, opener, killed, base, image, tmp_path):
    root = tmp_path / "root"
    if state == "legacy":
        root.mkdir()
        b, command, swapped = _legacy(base, root), "quantize", False
    else:
        shutil.copytree(killed(state), root, symlinks=True)  # journal names are relative
        b, (command, _, _, swapped) = root / "b", STATES[state]
    out = tmp_path / "out"
    out.mkdir()
    OPENERS[opener](b, out, image)
    assert siblings(b) == []  # staging, journal, old version and lock file: all gone
    manifest = load_manifest(b)  # a complete, verified bundle at the path
    # the killed writer's version if its swap happened, else the one before; and the
    # opener's own addition
    assert set(manifest.models) == {"fp32", *(["int8"] if swapped else []),
                                    *(["int4"] if opener == "quantize" else [])}
    assert set(manifest.targets) == ({"cpu"} if swapped and command == "target" else set()) \
        | ({"cpu"} if opener == "target" else set())
    assert user_files_intact(b)


def test_recovery_through_a_symlink_settles_the_target_not_the_link(killed, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(killed("quantize-moved-aside"), root, symlinks=True)
    link = tmp_path / "link"
    link.symlink_to(root / "b", target_is_directory=True)  # dangling until recovered
    r = run("info", link)
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and siblings(root / "b") == []
    assert set(load_manifest(link).models) == {"fp32"}


def test_a_corrupt_journal_is_a_clear_error_not_a_traceback(base, tmp_path):
    b = _copy(base, tmp_path)
    (b.parent / ".b.swap.json").write_text("{not json")
    for args in (["info", b], ["quantize", b, "--precision", "int8"]):
        r = run(*args)
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert ".b.swap.json" in r.output and "not a journal" in r.output
    assert (b.parent / ".b.swap.json").exists()  # nothing decided for the user


# -- a live writer's staging is its own ----------------------------------------------------
HOLD_LOCK = """
import sys
from vit_deploy.runtime.swap import writer_lock
with writer_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_live_writers_staging_survives_every_reader(base, image, tmp_path):
    b = _copy(base, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(b)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"  # event-driven: no sleeps
        # what the live writer has made so far (as `quantize` would: staging + a journal tmp)
        staging = Path(tempfile.mkdtemp(prefix=".b.tmp-", dir=b.parent))
        (staging / "model.int8.onnx").write_bytes(b"being written")
        legacy = Path(tempfile.mkdtemp(prefix=".b.q-", dir=b.parent))
        before = siblings(b)
        out = tmp_path / "out"
        out.mkdir()
        for name in ("info", "predict", "triton", "serve-loader", "runtime", "load_manifest"):
            OPENERS[name](b, out, image)
            assert siblings(b) == before, name
        r = run("quantize", b, "--precision", "int8")  # a second writer is refused
        assert r.exit_code == 1 and f"pid {holder.pid}" in r.output, r.output
        assert siblings(b) == before
        assert (staging / "model.int8.onnx").read_bytes() == b"being written"
        assert legacy.is_dir()
    finally:
        holder.communicate("done\n", timeout=60)
    r = run("info", b)  # its writer has gone: the next opener removes what it left
    assert r.exit_code == 0, r.output
    assert siblings(b) == []


def test_within_the_writing_process_its_own_staging_survives_opening_the_bundle(base, tmp_path):
    b = _copy(base, tmp_path)
    with swap.writer_lock(b), swap.staging_directory(b) as staging:
        (staging / "x").write_bytes(b"mine")
        load_manifest(b)
        with ViTSession(b):
            pass
        assert (staging / "x").read_bytes() == b"mine"
    assert siblings(b) == []  # and it goes when the writer is done


def test_staging_needs_the_lock(base, tmp_path):
    b = _copy(base, tmp_path)
    with pytest.raises(RuntimeError, match="writer_lock"):
        with swap.staging_directory(b):
            pass


@pytest.mark.parametrize("name", ["b.tmp-x", "b2", "bb", "b.tmp-abcdefghi"])
def test_only_the_bundles_own_staging_is_removed(base, tmp_path, name):
    """`.b.tmp-XXXXXXXX` is b's; `.b.tmp-x.tmp-XXXXXXXX` (bundle `b.tmp-x`), `.b2.tmp-...`,
    or a name mkdtemp does not make are not."""
    b = _copy(base, tmp_path)
    theirs = b.parent / (f".{name}.tmp-abcd1234" if name != "b.tmp-abcdefghi" else f".{name}")
    theirs.mkdir()
    ours = Path(tempfile.mkdtemp(prefix=".b.tmp-", dir=b.parent))
    load_manifest(b)
    assert not ours.exists() and theirs.is_dir()


def test_opening_a_clean_bundle_creates_nothing_beside_it(base, tmp_path):
    b = _copy(base, tmp_path)
    (b.parent / "other").mkdir()
    load_manifest(b)
    run("info", b)
    assert siblings(b) == ["other"]  # no lock file: nothing to recover, no lock taken


def test_a_folder_we_may_not_write_is_read_without_recovery(base, tmp_path, monkeypatch):
    """Leftovers beside a bundle in a read-only folder: it is still read; the next writer
    (who can write there) settles them."""
    b = _copy(base, tmp_path)
    staging = Path(tempfile.mkdtemp(prefix=".b.tmp-", dir=b.parent))
    real_open = os.open

    def read_only(path, flags, *a, **k):
        if str(path).endswith(".b.lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", read_only)
    assert set(load_manifest(b).models) == {"fp32"}
    assert staging.is_dir()
    monkeypatch.undo()
    load_manifest(b)
    assert not staging.exists()


def test_a_kill_while_removing_the_old_version_adopts_no_file_it_owned(base, tmp_path):
    """The old version half removed (its manifest already gone): the journal's record of
    its own names keeps them from being taken for a user's new files."""
    b = _copy(base, tmp_path)
    old = b.parent / ".b.old-1"
    shutil.copytree(b, old)
    (old / "model.int8.onnx").write_bytes(b"the old version's, dropped by the new one")
    (old / MANIFEST_NAME).unlink()  # removal had begun
    (old / "made-meanwhile.txt").write_text("a user's")  # created during the write
    swap._write_journal(b.resolve(), {
        "staged": ".b.tmp-abcd1234", "old": old.name,
        "manifest_sha256": sha256_file(b / MANIFEST_NAME),
        "old_owned": sorted({*load_manifest(b).files, "model.int8.onnx"})})
    load_manifest(b)
    assert siblings(b) == []
    assert not (b / "model.int8.onnx").exists()
    assert (b / "made-meanwhile.txt").read_text() == "a user's"
