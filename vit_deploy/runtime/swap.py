"""One writer per bundle, the journalled swap, and recovery after a kill (torch-free).

- **One writer.** A lock file beside the directory (`fcntl.flock`); a second writer fails
  at once with a message naming the first.
- **Swap.** The new version is staged in a sibling and exchanged with the old one in one
  `renameat2(RENAME_EXCHANGE)` call, so the path holds a complete directory at every
  instant; where the kernel or file system cannot exchange, the old directory is moved
  aside first, and a journal lets the next writer restore or finish the swap after a kill.
- **Recovery on open.** Whoever takes the lock first after a writer died finishes or undoes
  its swap and removes its staging directories (every staging directory of a bundle is
  `.NAME.tmp-XXXXXXXX` beside it, made by `staging_directory` under the lock, so a free
  lock means its writer is dead). Readers call `recover_on_open` where they open a bundle:
  only when a killed writer left something, and never while a writer holds the lock.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.runtime.files import (can_exchange, exchange, read_regular, sha256_file, umask,
                                      write_bytes_atomic)
from vit_deploy.runtime.errors import BAD_INPUT, FAILED, VitDeployError

# Called with the name of each step of a swap; tests set it to kill the process there.
step: Callable[[str], None] = lambda _name: None


class OutputExistsError(VitDeployError, FileExistsError):
    """The destination exists and may not be replaced."""

    exit_code = BAD_INPUT


class PlatformError(VitDeployError, RuntimeError):
    """This platform cannot do it (writing a bundle on Windows)."""

    exit_code = FAILED


# Writing and repairing bundles needs POSIX (fcntl.flock, O_NOFOLLOW, pread / pwrite);
# tests set it False to see what Windows gets
POSIX = os.name == "posix"


class BusyError(VitDeployError, RuntimeError):
    """Another process is writing the same directory."""

    exit_code = FAILED


# -- one writer ------------------------------------------------------------------------
_held: dict[Path, int] = {}


@contextlib.contextmanager
def writer_lock(dst: str | os.PathLike) -> Iterator[Path]:
    """Hold the lock of directory `dst` (re-entrant within a process). The lock file sits
    beside `dst`, is removed on release, and a lock taken on a file that was removed
    meanwhile is retried. Taking it (not re-entering it) first recovers what a killed
    writer left: its swap is finished or undone, its staging removed (`recover`)."""
    dst = Path(os.path.realpath(dst))
    if dst in _held:
        _held[dst] += 1
        try:
            yield dst
        finally:
            _held[dst] -= 1
        return
    if not POSIX:
        raise PlatformError(f"writing {str(dst)!r} needs Linux or macOS: the one-writer lock "
                            f"and the journalled swap use POSIX calls (flock, O_NOFOLLOW, "
                            f"pread); on {sys.platform} vit-deploy runs bundles, it does not "
                            f"write or repair them")
    import fcntl

    lock = dst.parent / f".{dst.name}.lock"
    dst.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = _open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise BusyError(f"{str(dst)!r} is being written by {holder}; run this again when "
                            f"it has finished") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the previous holder removed the file as we opened it: take a new one
    held = os.pread(fd, 200, 0)
    if held and not held.startswith(LOCK_TEXT):  # a file of someone else's at our lock's name
        os.close(fd)
        raise OutputExistsError(f"{str(lock)!r} is not a lock file vit-deploy wrote (it holds "
                                f"{held[:40]!r}); move it away to write {str(dst)!r}")
    os.ftruncate(fd, 0)
    os.pwrite(fd, LOCK_TEXT + f" (pid {os.getpid()})".encode(), 0)
    _held[dst] = 1
    try:
        recover(dst)  # any writer before us is gone: its leftovers are ours to settle
        yield dst
    finally:
        del _held[dst]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


LOCK_TEXT = b"vit-deploy"


def _open_lock(lock: Path) -> int:
    """Open (or create) the lock file: only a regular file of one link, never through a
    symlink, a FIFO or a device (whose target a writer would truncate, or that blocks)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise OutputExistsError(f"{str(lock)!r} should be vit-deploy's lock file but is "
                                    f"{_kind(lock)}; move it away") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise OutputExistsError(f"{str(lock)!r} should be vit-deploy's lock file but is "
                                f"{_kind(lock)}; move it away")
    return fd


def _kind(path: Path) -> str:
    try:
        st = os.lstat(path)
    except OSError:
        return "gone"
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if stat.S_ISREG(st.st_mode):
        return f"a file with {st.st_nlink} hard links"
    return {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket",
            stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}.get(stat.S_IFMT(st.st_mode),
                                                                   "not a regular file")


@contextlib.contextmanager
def staging_directory(dst: str | os.PathLike) -> Iterator[Path]:
    """A scratch directory beside `dst` for a writer that holds `dst`'s lock (quantize and
    target build their files here before `atomic_directory` swaps them in); removed on
    exit, and by the next holder of the lock if this process is killed."""
    dst = Path(os.path.realpath(dst))
    if dst not in _held:
        raise RuntimeError(f"staging beside {str(dst)!r} needs its writer_lock held")
    tmp = make_staging(dst)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_staging(dst: Path) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes 0700; a bundle is an ordinary directory
    return tmp


def swap(new: Path, dst: Path, old_owned: set[str] = frozenset()) -> None:
    """Make `new` the directory at `dst`, journalled so a kill at any step is recoverable.
    `old_owned`: the top-level names the old version owns (kept in the journal: a kill
    while the old version is being removed leaves it without its manifest)."""
    if not os.path.lexists(dst):
        os.rename(new, dst)
        step("renamed")
        return
    digest = sha256_file(new / MANIFEST_NAME) if (new / MANIFEST_NAME).is_file() else ""
    old = dst.parent / f".{dst.name}.old-{os.getpid()}"
    exchanging = can_exchange()
    record = {"staged": new.name, "manifest_sha256": digest,
              "old": None if exchanging else old.name, "old_owned": sorted(old_owned)}
    _write_journal(dst, record)
    step("journalled")
    if exchanging and exchange(new, dst):
        step("exchanged")
        _finish(dst, new, old_owned)  # `new` now holds the old version
    else:
        if exchanging:  # this file system refused: fall back, and say so in the journal
            record["old"] = old.name
            _write_journal(dst, record)
        os.rename(dst, old)
        step("moved-aside")
        os.rename(new, dst)
        step("moved-in")
        _finish(dst, old, old_owned)


def _finish(dst: Path, old: Path, old_owned: set[str]) -> None:
    """After the swap: entries created in the old version meanwhile move over; it goes."""
    _adopt_extras(old, dst, old_owned)
    step("adopted")
    shutil.rmtree(old, ignore_errors=True)
    step("removed-old")
    journal(dst).unlink(missing_ok=True)


def recover(dst: Path) -> None:
    """Finish or undo a swap that a killed writer left (call with the lock held), and
    remove its partial staging directories."""
    jpath = journal(dst)
    if jpath.exists():
        try:
            record = json.loads(read_regular(jpath, JOURNAL_MAX_BYTES))  # never a FIFO
            staged = _own(dst, record["staged"], _STAGED)
            old = _own(dst, record["old"], _OLD) if record.get("old") is not None else None
            digest = record["manifest_sha256"]
            old_owned = set(record["old_owned"]) if "old_owned" in record else None
            if not isinstance(digest, str) or not all(isinstance(n, str)
                                                      for n in old_owned or ()):
                raise TypeError(digest)
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            raise OutputExistsError(f"{str(jpath)!r} is not a journal vit-deploy wrote for "
                                    f"{str(dst)!r} (a journal names only this bundle's own "
                                    f"staging); nothing was changed: look at it and remove "
                                    f"it") from None
        swapped = ((dst / MANIFEST_NAME).is_file() and digest
                   and sha256_file(dst / MANIFEST_NAME) == digest)
        if old is None:  # exchange: `staged` holds the old version if the swap happened
            if swapped:
                _adopt_extras(staged, dst, old_owned)
            shutil.rmtree(staged, ignore_errors=True)
        elif not os.path.lexists(dst) and old.is_dir():
            os.rename(old, dst)  # killed between the two renames: the old version returns
            shutil.rmtree(staged, ignore_errors=True)
        else:
            if old.is_dir():
                if swapped:
                    _adopt_extras(old, dst, old_owned)
                    shutil.rmtree(old, ignore_errors=True)
                elif old.exists():
                    raise OutputExistsError(f"an interrupted write left {str(old)!r} and "
                                            f"{str(dst)!r}; neither was removed: compare them")
            shutil.rmtree(staged, ignore_errors=True)
        jpath.unlink()
    for leftover in _leftovers(dst):  # staging of a writer that died (we hold the lock)
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


# The names a journal may give: the staged version (`make_staging`) and the old one moved
# aside (`swap`). Anything else (a sibling, a path, `..`) is not ours to move or remove.
_STAGED = r"\.{name}\.tmp-[a-z0-9_]{{8}}"
_OLD = r"\.{name}\.old-[0-9]{{1,10}}"


def _own(dst: Path, name: object, pattern: str) -> Path:
    """The entry beside `dst` that a journal names, if the name is one our writer makes for
    `dst` and the entry is not a symlink (which a rename or rmtree would follow or move)."""
    if not isinstance(name, str) or not re.fullmatch(pattern.format(name=re.escape(dst.name)),
                                                     name):
        raise ValueError(name)
    path = dst.parent / name
    if path.is_symlink():
        raise ValueError(name)
    return path


# What a writer of NAME makes beside it: `.NAME.tmp-XXXXXXXX` (staging, by mkdtemp: 8 of
# [a-z0-9_]), `.NAME.swap.json.tmp-XXXXXXXX` (a journal being written), and the `.q-` / `.t-`
# staging of quantize and target before they staged through `staging_directory`.
_LEFTOVER = r"\.{name}\.(tmp|q|t|swap\.json\.tmp)-[a-z0-9_]{{8}}"


def _leftovers(dst: Path) -> list[Path]:
    """The staging entries beside `dst` that only a writer of `dst` makes."""
    pattern = re.compile(_LEFTOVER.format(name=re.escape(dst.name)))
    try:
        with os.scandir(dst.parent) as entries:
            return [Path(e.path) for e in entries if pattern.fullmatch(e.name)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def recover_on_open(bundle: str | os.PathLike) -> None:
    """Where a bundle is opened (for reading too): if a killed writer left a journal or
    staging beside it, take its lock, which finishes or undoes the swap and removes the
    staging. Nothing happens while a live writer holds the lock, within a process that
    holds it, for a file path, or where the lock cannot be created (a read-only folder)."""
    dst = Path(os.path.realpath(bundle))
    if dst in _held or (os.path.lexists(dst) and not dst.is_dir()):
        return
    if not journal(dst).exists() and not _leftovers(dst):
        return  # the common case: one stat and one listing of the parent
    try:
        with writer_lock(dst):
            pass  # taking the lock recovers
    except (BusyError, PlatformError):
        return  # a live writer: its journal and staging are its own (or not ours to repair)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        # a folder we may not write in: not ours to repair; its next writer will


def _adopt_extras(old: Path, dst: Path, ours: set[str] | None = None) -> None:
    """Entries in `old` that neither version owns and `dst` lacks (created by someone while
    we wrote) are moved into `dst`. `ours`: the old version's own names (else read from
    its manifest, which a kill while removing it may have taken)."""
    if not old.is_dir():  # already removed: a kill after the last step
        return
    if ours is None:  # a journal written before it recorded them: the old manifest's list
        ours = {name.split("/")[0] for name in _listed(old)}
    for entry in os.listdir(old):
        if entry not in ours and not os.path.lexists(dst / entry):
            os.rename(old / entry, dst / entry)


def _listed(directory: Path) -> set[str]:
    """The file names the manifest in `directory` lists (itself included), unverified."""
    try:
        files = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))["files"]
        return {*files, MANIFEST_NAME} if isinstance(files, dict) else set()
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return set()


JOURNAL_MAX_BYTES = 64 << 10  # a journal is a few hundred bytes: names and a digest


def journal(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.swap.json"


def _write_journal(dst: Path, record: dict) -> None:
    write_bytes_atomic(journal(dst), json.dumps(record).encode())


