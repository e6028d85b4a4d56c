"""Writing directories we own: atomic, locked, and never losing a file we did not write.

One mechanism serves every command that writes a directory (`export`, `quantize`,
`target`, `web`, `triton`); the lock, the journalled swap and the recovery after a kill are
the runtime's (`runtime/swap.py`: readers recover too), this module adds what only writers
need:

- **Ownership.** A directory is ours only when its manifest is one of ours and every file
  it lists matches its hash. Anything else that is not empty is replaced only with
  `force`, and even then files we did not write are kept (linked into the new version).
- **Outputs never clobber inputs.** `refuse_clobber` is the one check every command runs
  on the paths it writes that the user named: not inside a bundle it reads, not the same
  file as an input (symlinks resolved, hard links compared by device and inode).
- **Symlinks** are resolved first: writing through a link updates its target.

Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from vit_deploy.runtime import swap
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.runtime.files import fsync_tree, link_or_copy, sha256_file
from vit_deploy.runtime.manifest import MAX_MANIFEST_BYTES, load_manifest
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.swap import OutputExistsError, writer_lock

# The manifests of the directories we write that are not bundles, by what writes them
REPOSITORY_FORMATS = {"triton": "vit-deploy-triton-repository",  # vit-deploy triton
                      "web": "vit-deploy-web-site"}  # vit-deploy web


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
    if data.get("format") not in REPOSITORY_FORMATS.values() or not isinstance(files, dict):
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


def repository_record(root: Path, source: str | os.PathLike, kind: str) -> dict:
    """The manifest of a directory we write that is not a bundle (`kind`: triton, web):
    every file's hash, and the source bundle by its name only (a site is served to anyone:
    the path of the user's folders stays home)."""
    files = {p.relative_to(root).as_posix(): sha256_file(p)
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST_NAME}
    return {"format": REPOSITORY_FORMATS[kind], "format_version": 1,
            "source_bundle": Path(source).name, "files": files}


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
        tmp = swap.make_staging(dst)
        try:
            yield tmp
            swap.step("staged")
            if dst.is_dir():
                _carry_over(dst, tmp, owned or set(), force=force)
            swap.step("carried")
            fsync_tree(tmp)
            swap.swap(tmp, dst, {name.split("/")[0] for name in owned or ()})
        finally:
            if tmp.exists() and not swap.journal(dst).exists():
                shutil.rmtree(tmp, ignore_errors=True)


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


