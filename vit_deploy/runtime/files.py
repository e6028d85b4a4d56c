"""Files the bundle writers and readers share: hashing, atomic writes, hard links, and the
atomic exchange of two paths. A leaf: standard library only."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import stat
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def file_kind(mode: int) -> str:
    """What a file of st_mode `mode` is, in words: 'a directory', 'a FIFO (named pipe)', ..."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def not_a_file(path: str | Path) -> str | None:
    """Why `path` cannot be read as a checkpoint's file, or None when it can: a regular
    file once symlinks are resolved. A link to /dev/zero or /dev/urandom would be read
    until memory runs out, a FIFO blocks the reader forever: both are refused unopened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return ("a broken link (to a file that does not exist)" if os.path.islink(path)
                else "missing")
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    kind = file_kind(mode)
    real = os.path.realpath(path)
    return kind + (f" ({real!r})" if real != os.path.abspath(path) else "")


class NotRegularFile(ValueError):
    """`path` is not a regular file of at most `limit` bytes: `kind` says what it is (None for
    a regular file that is too large), `size` its size in bytes where it is a file."""

    def __init__(self, path: str | os.PathLike, limit: int, kind: str | None, size: int | None):
        self.path, self.limit, self.kind, self.size = os.fspath(path), limit, kind, size
        super().__init__(f"{self.path!r} is {kind}, not a file" if kind else
                         f"{self.path!r} holds {'more than ' if size is None else ''}"
                         f"{limit if size is None else size} bytes"
                         f"{'' if size is None else f', more than {limit}'}")


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of `path` if it is a regular file (symlinks followed) of at most `limit`
    bytes; NotRegularFile saying what it is otherwise (OSError where it cannot be opened or
    read). Opened without blocking and checked before reading: a FIFO is refused at once,
    /dev/zero is never read. The one reader of untrusted files (journals, saved reports)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:  # checked before a file object is made of it (Python refuses a directory's fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(path, limit, file_kind(info.st_mode), None)
        if info.st_size > limit:
            raise NotRegularFile(path, limit, None, info.st_size)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotRegularFile(path, limit, None, None)
    return data


def can_exchange() -> bool:
    return (os.environ.get("VIT_DEPLOY_NO_EXCHANGE") != "1"
            and hasattr(_libc(), "renameat2"))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where unsupported."""
    rc = _libc().renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                           _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def write_bytes_atomic(dst: str | os.PathLike, data: bytes) -> Path:
    """Write a file through a temporary sibling and rename it into place."""
    return write_atomic(dst, lambda f: f.write(data))


def write_atomic(dst: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """`write(f)` into a temporary sibling of `dst`, synced, then renamed into place: a
    reader sees the old file or the whole new one, never part of it."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.tmp-", dir=dst.parent)
    try:
        if hasattr(os, "fchmod"):  # POSIX (Windows has it from Python 3.13, as a read-only bit)
            os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600; artifacts are ordinary files
        with os.fdopen(fd, "wb") as f:
            write(f)
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


def umask() -> int:
    """The process umask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_tree(root: Path) -> None:
    """fsync every regular file under `root` (before it is swapped in)."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
