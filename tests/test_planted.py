"""Nothing of the user's is touched by files planted beside a bundle (an archive unpacked
next to it can hold anything): a journal acts only on this bundle's own staging names, and
the writer lock is only ever a regular file of ours, never followed through a symlink."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.runtime.files import sha256_file

PHOTO = Path(__file__).resolve().parents[1] / "vit_deploy" / "data" / "photos" / "eval-hopper.jpg"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def base(make_tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("planted") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(resolution=(32, 32), simplify=False))
    return out


@pytest.fixture
def scene(base, tmp_path):
    """The bundle `X` in a folder beside the user's own directory `mine` and file `notes`."""
    root = tmp_path / "root"
    bundle = root / "X"
    shutil.copytree(base, bundle)
    (root / "mine").mkdir()
    (root / "mine" / "thesis.tex").write_text("years of work")
    (root / "notes").write_text("do not lose")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.bin").write_bytes(b"keep")
    return bundle, root, outside


def intact(root: Path, outside: Path, bundle: Path) -> bool:
    return ((root / "mine" / "thesis.tex").read_text() == "years of work"
            and (root / "notes").read_text() == "do not lose"
            and (outside / "data.bin").read_bytes() == b"keep"
            and (bundle / MANIFEST_NAME).is_file())


def _journals(root: Path, outside: Path, bundle: Path) -> dict[str, dict]:
    digest = sha256_file(bundle / MANIFEST_NAME)
    base = {"manifest_sha256": digest, "old_owned": []}
    return {
        "staged names a sibling": base | {"staged": "mine", "old": None},
        "staged is an absolute path": base | {"staged": str(outside), "old": None},
        "staged climbs out": base | {"staged": "../outside", "old": None},
        "staged looks like ours but climbs": base | {"staged": ".X.tmp-../../outside",
                                                     "old": None},
        "old names a sibling": base | {"staged": ".X.tmp-abcdefgh", "old": "mine"},
        "old is an absolute path": base | {"staged": ".X.tmp-abcdefgh", "old": str(outside)},
        "staged is a list": base | {"staged": ["mine"], "old": None},
        "digest is not a string": {"staged": ".X.tmp-abcdefgh", "old": None,
                                   "manifest_sha256": {"x": 1}, "old_owned": []},
    }


CASES = ["staged names a sibling", "staged is an absolute path", "staged climbs out",
         "staged looks like ours but climbs", "old names a sibling", "old is an absolute path",
         "staged is a list", "digest is not a string"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", ["info", "predict", "quantize"])
def test_a_planted_journal_moves_and_removes_nothing_of_the_users(scene, case, command):
    bundle, root, outside = scene
    (root / ".X.swap.json").write_text(json.dumps(_journals(root, outside, bundle)[case]))
    args = {"info": ["info", bundle], "predict": ["predict", bundle, PHOTO],
            "quantize": ["quantize", bundle, "--precision", "fp16", "--quiet"]}[command]
    r = run(*args)
    assert intact(root, outside, bundle), (case, command, r.output)
    assert r.exit_code != 0 and "is not a journal vit-deploy wrote" in r.output, r.output
    assert "Traceback" not in r.output
    assert (root / ".X.swap.json").exists()  # the user looks at it; nothing changed


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "huge", "directory"])
def test_a_journal_that_is_not_a_small_file_is_refused_unread(scene, kind):
    """A FIFO at the journal's name hung every reader of the bundle; /dev/zero (a link)
    filled memory: the journal is read only as a regular file of at most 64 KiB."""
    import time

    bundle, root, outside = scene
    at = root / ".X.swap.json"
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "/dev/zero":
        at.symlink_to("/dev/zero")
    elif kind == "huge":
        at.write_text(json.dumps({"staged": ".X.tmp-abcdefgh", "pad": "x" * (1 << 17)}))
    else:
        at.mkdir()
    start = time.monotonic()
    r = run("info", bundle)
    assert time.monotonic() - start < 30
    assert r.exit_code != 0 and "is not a journal vit-deploy wrote" in r.output, r.output
    assert "Traceback" not in r.output and intact(root, outside, bundle)
    assert os.path.lexists(at)  # the user's, left as it was


@pytest.mark.parametrize("which", ["staged", "old"])
def test_a_journal_whose_staging_name_is_a_symlink_is_not_followed(scene, which):
    """`.X.tmp-abcdefgh` (or `.X.old-1`) as a symlink to the user's directory: neither the
    link's target is removed nor the link moved into the bundle's place."""
    bundle, root, outside = scene
    link = root / (".X.tmp-abcdefgh" if which == "staged" else ".X.old-1")
    link.symlink_to(root / "mine")
    record = {"manifest_sha256": "0" * 64, "old_owned": [], "staged": ".X.tmp-zzzzzzzz",
              "old": None} | {which: link.name}
    (root / ".X.swap.json").write_text(json.dumps(record))
    r = run("info", bundle)
    assert r.exit_code != 0 and "is not a journal vit-deploy wrote" in r.output, r.output
    assert intact(root, outside, bundle) and link.is_symlink()


def test_our_own_journal_is_still_recovered(scene):
    """The names a writer really makes are honoured: an exchange journal whose staged
    version holds the old bundle is settled (staging removed, journal gone)."""
    bundle, root, outside = scene
    staged = root / ".X.tmp-abc_1234"
    shutil.copytree(bundle, staged)
    (root / ".X.swap.json").write_text(json.dumps({
        "staged": staged.name, "old": None, "old_owned": [],
        "manifest_sha256": sha256_file(bundle / MANIFEST_NAME)}))
    r = run("info", bundle)
    assert r.exit_code == 0, r.output
    assert not staged.exists() and not (root / ".X.swap.json").exists()
    assert intact(root, outside, bundle)


def _lock_kinds(root: Path, outside: Path) -> dict:
    target = outside / "data.bin"
    return {
        "symlink to a user's file": lambda p: p.symlink_to(target),
        "dangling symlink": lambda p: p.symlink_to(outside / "new-file"),
        "hard link to a user's file": lambda p: os.link(target, p),
        "FIFO": lambda p: os.mkfifo(p),
        "directory": lambda p: p.mkdir(),
        "someone else's file": lambda p: p.write_text("my shopping list"),
    }


LOCKS = ["symlink to a user's file", "dangling symlink", "hard link to a user's file", "FIFO",
         "directory", "someone else's file"]


@pytest.mark.parametrize("kind", LOCKS)
@pytest.mark.parametrize("command", ["quantize", "reader with leftover staging"])
def test_the_lock_is_never_followed_or_truncated(scene, kind, command):
    bundle, root, outside = scene
    lock = root / ".X.lock"
    _lock_kinds(root, outside)[kind](lock)
    if command == "quantize":
        r = run("quantize", bundle, "--precision", "fp16", "--quiet")
    else:  # a killed writer's staging makes a reader take the lock to clean up
        (root / ".X.tmp-deadbeef").mkdir()
        r = run("info", bundle)
    assert intact(root, outside, bundle), r.output
    assert not (outside / "new-file").exists()
    assert r.exit_code != 0, r.output
    assert "should be vit-deploy's lock file" in r.output or "is not a lock file" in r.output, \
        r.output
    assert str(lock) in r.output and "Traceback" not in r.output
    assert os.path.lexists(lock)  # the user's entry stays


def test_a_stale_lock_of_ours_is_taken_over(scene):
    """A lock file a killed writer left (our text, no holder) does not block the next one."""
    bundle, root, _ = scene
    (root / ".X.lock").write_text("vit-deploy (pid 999999)")
    r = run("quantize", bundle, "--precision", "fp16", "--quiet")
    assert r.exit_code == 0, r.output
    assert not (root / ".X.lock").exists()


def test_where_posix_locks_are_missing_writers_refuse_and_readers_run(scene, monkeypatch):
    """Windows has no flock / O_NOFOLLOW / pread: writing a bundle is refused with one line
    saying so (nothing written), while reading and running it still works, leftovers and
    all (they are left for a POSIX writer to settle)."""
    from vit_deploy.runtime import ViTSession, swap

    bundle, root, outside = scene
    monkeypatch.setattr(swap, "POSIX", False)
    before = sorted(p.name for p in bundle.iterdir())
    r = run("quantize", bundle, "--precision", "fp16", "--quiet")
    assert r.exit_code == 1 and "needs Linux or macOS" in r.output, r.output
    assert sorted(p.name for p in bundle.iterdir()) == before
    (root / ".X.tmp-deadbeef").mkdir()
    r = run("info", bundle)
    assert r.exit_code == 0, r.output
    with ViTSession(bundle) as s:
        assert s.predict(PHOTO)[0].top
    assert (root / ".X.tmp-deadbeef").exists() and intact(root, outside, bundle)
