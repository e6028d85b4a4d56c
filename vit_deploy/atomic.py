"""Atomic artifacts: a file or a whole directory appears complete or not at all (torch-free)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vit_deploy.contract import MANIFEST_NAME


class OutputExistsError(FileExistsError):
    """The destination exists and may not be replaced."""


def is_bundle(path: Path) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()


def check_destination(dst: Path, *, force: bool) -> None:
    """Refuse a destination we could not replace safely. A previous bundle may be replaced;
    a file, or a non-empty directory that is not a bundle, only with `force`."""
    dst = Path(dst)
    if not dst.exists() or force:
        return
    if dst.is_dir() and (is_bundle(dst) or not any(dst.iterdir())):
        return
    what = "a file" if not dst.is_dir() else "a non-empty directory that is not a bundle"
    raise OutputExistsError(
        f"output {str(dst)!r} exists and is {what}; choose another --out or pass --force "
        f"to replace it")


@contextlib.contextmanager
def atomic_directory(dst: str | os.PathLike, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `dst` by rename.

    On any exception (or a kill) `dst` is left as it was: absent, or the previous
    complete directory. Leftover `.name.tmp-*` siblings are only ever partial work.
    """
    dst = Path(dst).absolute()
    check_destination(dst, force=force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a bundle is an ordinary directory
    try:
        yield tmp
        _fsync_tree(tmp)
        if dst.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
            os.rename(dst, old / "x")
            os.rename(tmp, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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


def _umask() -> int:
    """The process umask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
