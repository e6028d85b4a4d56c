"""The files of an embedding job, without Ray: which images (folders, files, lists of
paths), their shards (deterministic: the sorted paths cut into runs of `shard_size`, each
named by its index and a hash of the job and its paths, so a rerun finds the shards a
killed run finished), and Parquet files written atomically (a temporary sibling, fsync,
rename: a reader or a rerun never sees half a file)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vit_deploy.runtime.files import file_kind, write_atomic

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif",
                            ".tiff", ".ppm", ".pgm"})
LIST_SUFFIXES = frozenset({".txt", ".lst", ".list"})  # one image path per line


def collect_paths(inputs: Iterable[str | os.PathLike]) -> list[str]:
    """Every image named by `inputs`, as sorted absolute paths without repeats: a folder
    gives its images (recursively, by suffix: IMAGE_SUFFIXES), a .txt / .lst / .list file
    the paths on its lines (relative ones from the list's folder; blank lines and lines
    starting with # skipped), any other file itself (a bad image is recorded by the job,
    not refused here). ValueError naming the first path that does not exist, or when no
    image is found."""
    found: set[str] = set()
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found.update(os.path.abspath(p) for p in path.rglob("*")
                         if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif path.exists() and (why := _not_regular(path)):
            raise ValueError(f"image input {str(item)!r} is {why}, not a file (expected a "
                             f"folder, an image or a .txt list of paths)")
        elif path.is_file() and path.suffix.lower() in LIST_SUFFIXES:
            found.update(_listed(path))
        elif path.is_file():
            found.add(os.path.abspath(path))
        else:
            raise ValueError(f"image input {str(item)!r} does not exist (expected a folder, "
                             f"an image or a .txt list of paths)")
    if not found:
        raise ValueError(f"no images found in {[str(i) for i in inputs][:5]} (looked for "
                         f"{', '.join(sorted(IMAGE_SUFFIXES))})")
    return sorted(found)


def _listed(listing: Path) -> list[str]:
    out = []
    for number, line in enumerate(listing.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        path = Path(text) if os.path.isabs(text) else listing.parent / text
        if not path.exists():
            raise ValueError(f"{str(listing)!r} line {number}: {text!r} does not exist")
        if why := _not_regular(path):  # a FIFO blocks its reader, /dev/zero never ends
            raise ValueError(f"{str(listing)!r} line {number}: {text!r} is {why}, not an "
                             f"image file")
        out.append(os.path.abspath(path))
    return out


def _not_regular(path: Path) -> str | None:
    """None for a regular file (links followed) or a folder; else what it is."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return file_kind(mode)


def stamps(paths: Sequence[str]) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime in ns)}: what tells a replaced image from the one a shard holds."""
    out = {}
    for p in paths:
        st = os.stat(p)
        out[p] = (st.st_size, st.st_mtime_ns)
    return out


@dataclass(frozen=True)
class Shard:
    """A run of the sorted paths, written as one Parquet file named `name`."""

    index: int
    paths: tuple[str, ...]
    name: str


def plan(paths: Sequence[str], *, job: str, shard_size: int,
         files: dict[str, tuple[int, int]] | None = None) -> list[Shard]:
    """The sorted `paths` cut into shards of `shard_size`; a shard's name holds its index
    and a hash of `job` (what decides its rows: the model file, the outputs, top-k), its
    paths and, given `files` (stamps), each file's size and modification time, so the same
    job over the same images names the same shards, and a replaced image another."""
    if shard_size < 1:
        raise ValueError(f"shard size must be >= 1, got {shard_size}")
    paths = sorted(paths)
    shards = []
    for index, start in enumerate(range(0, len(paths), shard_size)):
        part = tuple(paths[start:start + shard_size])
        keys = part if files is None else tuple(f"{p}\0{files[p][0]}\0{files[p][1]}"
                                                for p in part)
        digest = hashlib.sha256("\n".join((job, *keys)).encode()).hexdigest()[:16]
        shards.append(Shard(index, part, f"part-{index:05d}-{digest}.parquet"))
    return shards


def job_key(*fields: object) -> str:
    """A short hash of what decides a shard's rows."""
    return hashlib.sha256(repr(fields).encode()).hexdigest()[:16]


def parts_dir(out: Path) -> Path:
    """Where a job writing `out` keeps its shards until `out` is written: beside it."""
    return out.with_name(f".{out.name}.parts")


PARTS_MARK = ".vit-deploy-embed"  # in a shard folder: vit-deploy made it


def own_parts_dir(out: Path) -> Path:
    """The shard folder of `out`, made (with its mark) or found ours: what is at the name
    and is not a real folder carrying the mark (a user's folder, a symlink, a file) is
    refused, never written into or removed."""
    folder = parts_dir(out)
    if not os.path.lexists(folder):
        folder.mkdir()
        (folder / PARTS_MARK).write_text("shards of a vit-deploy embed job; removed when "
                                         "the output is written\n")
        return folder
    st = os.lstat(folder)
    mark = folder / PARTS_MARK
    if not stat.S_ISDIR(st.st_mode) or not mark.is_file() or mark.is_symlink():
        kind = ("a symlink" if stat.S_ISLNK(st.st_mode) else
                "a folder vit-deploy did not make" if stat.S_ISDIR(st.st_mode) else "a file")
        raise ValueError(f"{str(folder)!r} (where embed keeps the shards of --out) is {kind}; "
                         f"move it away")
    return folder


def write_table_atomic(table: pa.Table, path: Path) -> Path:
    """`table` as Parquet at `path`, through a temporary sibling renamed into place."""
    return write_atomic(path, lambda f: pq.write_table(table, f))


def remove_partial(folder: Path) -> None:
    """Temporary files a killed writer left in `folder` (never a finished shard)."""
    for stale in folder.glob(".*.tmp-*"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def merge(shard_files: Sequence[Path], out: Path) -> pa.Table:
    """The shards, in order, as one table written atomically to `out`; ValueError if a
    path appears twice (a shard of another job in the way)."""
    table = pa.concat_tables([pq.read_table(p) for p in shard_files], promote_options="default")
    paths = table.column("path")
    if len(pc.unique(paths)) != len(paths):
        raise ValueError(f"the shards in {str(shard_files[0].parent)!r} repeat image paths; "
                         f"remove that folder and run again")
    write_table_atomic(table, out)
    return table
