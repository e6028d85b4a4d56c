"""Writing directories we own: atomic, locked, and never losing a file we did not write.

One mechanism serves every command that writes a directory (`export`, `quantize`,
`triton`):

- **Ownership.** A directory is ours only when its manifest is one of ours and every file
  it lists matches its hash. Anything else that is not empty is replaced only with
  `force`, and even then files we did not write are kept (linked into the new version).
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
- **Outputs never clobber inputs.** `refuse_clobber` is the one check every command runs
  on the paths it writes that the user named: not inside a bundle it reads, not the same
  file as an input (symlinks resolved, hard links compared by device and inode).
- **Symlinks** are resolved first: writing through a link updates its target.

Torch-free.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from vit_deploy.contract import MANIFEST_NAME
from vit_deploy.runtime.manifest import MAX_MANIFEST_BYTES, BundleError, load_manifest, sha256_file

REPOSITORY_FORMAT = "vit-deploy-triton-repository"  # what `vit-deploy triton` writes

# Called with the name of each step of a swap; tests set it to kill the process there.
_step: Callable[[str], None] = lambda _name: None


class OutputExistsError(FileExistsError):
    """The destination exists and may not be replaced."""


class BusyError(RuntimeError):
    """Another process is writing the same directory."""


class ClobberError(OutputExistsError):
    """An output path points into a bundle the command reads or at one of its inputs."""


# -- ownership -------------------------------------------------------------------------
def owned_files(directory: Path) -> set[str] | None:
    """The files our manifest in `directory` lists (manifest included) if the manifest is
    ours and every file matches its hash; None for anything else."""
    directory = Path(directory)
    try:
        return set(load_manifest(directory).owned_files())  # a bundle, verified
    except BundleError:
        pass
    except OSError:
        return None
    path = directory / MANIFEST_NAME  # else perhaps a Triton repository we wrote
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if data.get("format") != REPOSITORY_FORMAT or not isinstance(files, dict):
        return None
    for name, digest in files.items():
        try:
            if not isinstance(digest, str) or sha256_file(Path(directory) / name) != digest:
                return None
        except OSError:
            return None
    return {*files, MANIFEST_NAME}


def is_bundle(path: Path) -> bool:
    return owned_files(Path(path)) is not None


def repository_record(root: Path, source: str) -> dict:
    """The manifest of a directory we write that is not a bundle: every file's hash."""
    files = {p.relative_to(root).as_posix(): sha256_file(p)
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST_NAME}
    return {"format": REPOSITORY_FORMAT, "format_version": 1, "source_bundle": source,
            "files": files}


def refuse_clobber(output: str | os.PathLike, *, option: str,
                   bundles: Iterable[str | os.PathLike] = (),
                   inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Refuse an output path the user named that would overwrite what the command reads:
    a path inside a bundle it reads (or the bundle itself, or a folder holding it), or the
    same file as one of its inputs. Symlinks are resolved; an existing output is compared
    by device and inode too (a hard link, or another spelling on a case-insensitive file
    system). `bundles` may name a bare .onnx file: it counts as an input. ClobberError
    (a usage error) naming the input otherwise."""
    out = Path(os.path.realpath(output))
    out_stat = _stat(out)
    # the output's folders that exist, innermost first (by inode: spelling does not matter)
    folders = [s for s in map(_stat, out.parents) if s is not None]
    for bundle in bundles:
        root = Path(os.path.realpath(bundle))
        root_stat = _stat(root)
        if root_stat is None:
            continue  # nothing there to overwrite (the command will say it is missing)
        if not os.path.isdir(root):
            inputs = [*inputs, root]
            continue
        inside = any(os.path.samestat(root_stat, s) for s in folders)
        if out == root or (out_stat is not None and os.path.samestat(out_stat, root_stat)) \
                or inside or root in out.parents:
            raise ClobberError(f"{option} {str(output)!r} is inside the bundle {str(bundle)!r} "
                               f"that this command reads; write it outside the bundle")
        if out in root.parents:
            raise ClobberError(f"{option} {str(output)!r} is a folder holding the bundle "
                               f"{str(bundle)!r} that this command reads; choose another path")
        if out_stat is not None and not os.path.isdir(out):
            for path in _files(root):  # a hard link to one of the bundle's files
                if os.path.samestat(out_stat, path.lstat()):
                    raise ClobberError(f"{option} {str(output)!r} is the same file as "
                                       f"{str(path)!r} in the bundle {str(bundle)!r} (a hard "
                                       f"link); writing it would replace the bundle's file")
    for source in inputs:
        src = Path(os.path.realpath(source))
        src_stat = _stat(src)
        if out == src or (out_stat is not None and src_stat is not None
                          and os.path.samestat(out_stat, src_stat)):
            how = ("" if os.path.abspath(output) == os.path.abspath(source)
                   else " under another name (a link)")
            raise ClobberError(f"{option} {str(output)!r} is the input {str(source)!r}{how}; "
                               f"writing it would replace that input; choose another path")


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _files(root: Path) -> Iterator[Path]:
    for folder, _dirs, names in os.walk(root):
        for name in names:
            yield Path(folder) / name


def claim_destination(dst: str | os.PathLike, *, force: bool,
                      source: str | os.PathLike | None = None) -> set[str] | None:
    """Refuse a destination we may not write; returns the files of ours it holds (None: it
    is not ours, every entry in it is kept)."""
    dst = Path(os.path.realpath(dst))
    cwd = Path.cwd().resolve()
    if dst == cwd or dst in cwd.parents:
        raise OutputExistsError(f"output {str(dst)!r} is the current directory or one of its "
                                f"parents; choose a new directory to write into")
    if source is not None:
        refuse_clobber(dst, option="--out", bundles=[source])
    if not os.path.lexists(dst):
        return None
    if not dst.is_dir():
        raise OutputExistsError(f"output {str(dst)!r} exists and is a file, not a directory; "
                                f"choose another --out")
    owned = owned_files(dst)
    if owned is None and any(dst.iterdir()) and not force:
        raise OutputExistsError(
            f"output {str(dst)!r} is a non-empty directory that is not a bundle vit-deploy wrote "
            f"(no manifest of ours whose files match their hashes); choose another --out, or pass "
            f"--force to write into it (its other files are kept)")
    return owned


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
    import fcntl

    lock = dst.parent / f".{dst.name}.lock"
    dst.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
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
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"vit-deploy (pid {os.getpid()})".encode(), 0)
    _held[dst] = 1
    try:
        recover(dst)  # any writer before us is gone: its leftovers are ours to settle
        yield dst
    finally:
        del _held[dst]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


# -- the swap --------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_directory(dst: str | os.PathLike, *, force: bool = False,
                     source: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield a staging directory; on success it becomes `dst` in one atomic exchange.

    Entries of the old `dst` that it does not own (a user's notes, a calibration folder,
    `.ort-cache`) are linked into the new version unless the new version writes the same
    name (then, for a directory we own, that is refused without `force`). On any exception
    or kill `dst` is left as it was.
    """
    with writer_lock(dst) as dst:
        owned = claim_destination(dst, force=force, source=source)
        tmp = _make_staging(dst)
        try:
            yield tmp
            _step("staged")
            if dst.is_dir():
                _carry_over(dst, tmp, owned or set(), force=force)
            _step("carried")
            _fsync_tree(tmp)
            _swap(tmp, dst, {name.split("/")[0] for name in owned or ()})
        finally:
            if tmp.exists() and not _journal(dst).exists():
                shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staging_directory(dst: str | os.PathLike) -> Iterator[Path]:
    """A scratch directory beside `dst` for a writer that holds `dst`'s lock (quantize and
    target build their files here before `atomic_directory` swaps them in); removed on
    exit, and by the next holder of the lock if this process is killed."""
    dst = Path(os.path.realpath(dst))
    if dst not in _held:
        raise RuntimeError(f"staging beside {str(dst)!r} needs its writer_lock held")
    tmp = _make_staging(dst)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _make_staging(dst: Path) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a bundle is an ordinary directory
    return tmp


def _carry_over(old: Path, new: Path, owned: set[str], *, force: bool) -> None:
    """Link every entry of `old` that it does not own into `new` (directories recursively)."""
    ours = {name.split("/")[0] for name in owned}
    for entry in sorted(os.listdir(old)):
        if entry in ours:
            continue
        src, dst = old / entry, new / entry
        if os.path.lexists(dst):
            if not force:
                raise OutputExistsError(
                    f"{str(src)!r} was not written by vit-deploy and the new version writes the "
                    f"same name; move it away, or pass --force to replace it")
            continue
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True, copy_function=link_or_copy)
        else:
            link_or_copy(src, dst)


def _swap(new: Path, dst: Path, old_owned: set[str] = frozenset()) -> None:
    """Make `new` the directory at `dst`, journalled so a kill at any step is recoverable.
    `old_owned`: the top-level names the old version owns (kept in the journal: a kill
    while the old version is being removed leaves it without its manifest)."""
    if not os.path.lexists(dst):
        os.rename(new, dst)
        _step("renamed")
        return
    digest = sha256_file(new / MANIFEST_NAME) if (new / MANIFEST_NAME).is_file() else ""
    old = dst.parent / f".{dst.name}.old-{os.getpid()}"
    exchange = _can_exchange()
    record = {"staged": new.name, "manifest_sha256": digest,
              "old": None if exchange else old.name, "old_owned": sorted(old_owned)}
    _write_journal(dst, record)
    _step("journalled")
    if exchange and _exchange(new, dst):
        _step("exchanged")
        _finish(dst, new, old_owned)  # `new` now holds the old version
    else:
        if exchange:  # this file system refused: fall back, and say so in the journal
            record["old"] = old.name
            _write_journal(dst, record)
        os.rename(dst, old)
        _step("moved-aside")
        os.rename(new, dst)
        _step("moved-in")
        _finish(dst, old, old_owned)


def _finish(dst: Path, old: Path, old_owned: set[str]) -> None:
    """After the swap: entries created in the old version meanwhile move over; it goes."""
    _adopt_extras(old, dst, old_owned)
    _step("adopted")
    shutil.rmtree(old, ignore_errors=True)
    _step("removed-old")
    _journal(dst).unlink(missing_ok=True)


def recover(dst: Path) -> None:
    """Finish or undo a swap that a killed writer left (call with the lock held), and
    remove its partial staging directories."""
    journal = _journal(dst)
    if journal.exists():
        try:
            record = json.loads(journal.read_text())
            staged = dst.parent / record["staged"]
            old = dst.parent / record["old"] if record.get("old") else None
            digest = record["manifest_sha256"]
            old_owned = set(record["old_owned"]) if "old_owned" in record else None
        except (OSError, ValueError, KeyError, TypeError):
            raise OutputExistsError(f"{str(journal)!r} is not a journal vit-deploy can read; "
                                    f"look at it and remove it") from None
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
        journal.unlink()
    for leftover in _leftovers(dst):  # staging of a writer that died (we hold the lock)
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


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
    if not _journal(dst).exists() and not _leftovers(dst):
        return  # the common case: one stat and one listing of the parent
    try:
        with writer_lock(dst):
            pass  # taking the lock recovers
    except BusyError:
        return  # a live writer: its journal and staging are its own
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
    if ours is None:
        ours = {name.split("/")[0] for name in owned_files(old) or ()}
    for entry in os.listdir(old):
        if entry not in ours and not os.path.lexists(dst / entry):
            os.rename(old / entry, dst / entry)


def _journal(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.swap.json"


def _write_journal(dst: Path, record: dict) -> None:
    write_bytes_atomic(_journal(dst), json.dumps(record).encode())


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _can_exchange() -> bool:
    return (os.environ.get("VIT_DEPLOY_NO_EXCHANGE") != "1"
            and hasattr(_libc(), "renameat2"))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where unsupported."""
    rc = _libc().renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                           _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


# -- files -----------------------------------------------------------------------------
def write_bytes_atomic(dst: str | os.PathLike, data: bytes) -> Path:
    """Write a file through a temporary sibling and rename it into place."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.tmp-", dir=dst.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; artifacts are ordinary files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return dst


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """A hard link (a multi-GB model is not copied), else a copy."""
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _umask() -> int:
    """The process umask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
