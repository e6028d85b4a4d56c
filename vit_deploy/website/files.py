"""The files `vit-deploy web` copies into a site, and where they are found.

Dependency-free on purpose: setup.py loads this file by path (nothing else of vit_deploy
is importable while a wheel builds) to copy the same files into the wheel's
`vit_deploy/web_assets/`, so the list lives in one place.

Both trees have the repository's layout, below their root:

    package.json                                  pins onnxruntime-web
    src/vit-deploy.mjs, src/browser.mjs           the entries a page may import
    src/lib/*.mjs                                 the modules they import (less Node's own)
    src/index.html                                the demo page
    node_modules/onnxruntime-web/package.json     the installed version
    node_modules/onnxruntime-web/dist/<ORT_FILES>
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MODULE = "vit-deploy.mjs"  # the entry the page imports: it loads the browser's platform module
# The JavaScript a site serves: the entries a page may import and every module under lib/
# but what only Node runs (vit-deploy.mjs imports Node's platform module only in Node).
ENTRIES = (MODULE, "browser.mjs")
LIB_DIR = "lib"
NODE_ONLY = ("platform-node.mjs",)
PAGE = "index.html"
ORT_PACKAGE = "onnxruntime-web"
ORT_DIST = Path("node_modules") / ORT_PACKAGE / "dist"
# onnxruntime-web's files the module imports: the WebAssembly-only build (used when the
# browser offers no WebGPU adapter; the smaller download) and the WebGPU build (JSEP-free
# native WebGPU EP, with its own WebAssembly CPU fallback).
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm",
             "ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs",
             "ort-wasm-simd-threaded.asyncify.wasm")
ORT_WASM_ONLY = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
# Where the wheel carries them (a package directory beside this file).
PACKAGED_DIR = "web_assets"
PACKAGE_JSON_MAX_BYTES = 1 << 20  # npm's package.json files are kilobytes


def site_modules(root: Path) -> list[str]:
    """The JavaScript files a site serves, relative to ROOT/src (POSIX paths)."""
    lib = sorted(p.name for p in (root / "src" / LIB_DIR).glob("*.mjs") if p.name not in NODE_ONLY)
    return [*ENTRIES, *(f"{LIB_DIR}/{name}" for name in lib)]


def asset_files(root: Path) -> list[str]:
    """Every file a site is made from, relative to `root` (POSIX paths): what a wheel
    carries. FileNotFoundError names the first one missing."""
    ort = ORT_DIST.parent.as_posix()
    files = ["package.json", *(f"src/{m}" for m in site_modules(root)), f"src/{PAGE}",
             f"{ort}/package.json", *(f"{ORT_DIST.as_posix()}/{name}" for name in ORT_FILES)]
    for name in files:
        if not (root / name).is_file():
            raise FileNotFoundError(f"{str(root / name)!r} is missing (run `npm ci` in web/: "
                                    f"`make setup`)")
    return files


def package_string(path: Path, *keys: str) -> str:
    """The string at `keys` in the package.json at `path` (its version, or the version it
    pins: "dependencies", ORT_PACKAGE). ValueError, one line naming the file, what was
    expected and what it holds, for anything else: a file that is not there or not a regular
    file (a directory, a FIFO is not read), not JSON, nested past the stack, not an object,
    the key missing, a value that is not a string (a number is not a version)."""
    data = _read_package(path)
    where, value, seen = str(path), data, []
    for key in keys:
        if not isinstance(value, dict):
            raise ValueError(f"{where!r}: expected {'.'.join(seen) or 'the file'} to be a JSON "
                             f"object, got {_json_type(value)}")
        seen.append(key)
        if key not in value:
            raise ValueError(f"{where!r} has no {'.'.join(keys)}: expected a version string "
                             f"there")
        value = value[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where!r}: expected {'.'.join(keys)} to be a version string, got "
                         + ("null" if value is None else f"{_json_type(value)} {_short(value)}"))
    return value


def _read_package(path: Path) -> Any:
    """A package.json parsed; opened without blocking and checked to be a regular file of
    at most PACKAGE_JSON_MAX_BYTES before it is read (a FIFO would block, /dev/zero never
    ends)."""
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise ValueError(f"cannot read {where!r}: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{where!r}: expected a package.json file, got "
                             f"{_file_kind(info.st_mode)}")
        if info.st_size > PACKAGE_JSON_MAX_BYTES:
            raise ValueError(f"{where!r}: expected a package.json of at most "
                             f"{PACKAGE_JSON_MAX_BYTES >> 10} KiB, got {info.st_size >> 10} KiB")
    except BaseException:
        os.close(fd)
        raise
    with open(fd, "rb") as f:
        try:
            data = f.read(PACKAGE_JSON_MAX_BYTES + 1)
        except OSError as e:
            raise ValueError(f"cannot read {where!r}: {e.strerror or e}") from None
    try:
        return json.loads(data.decode("utf-8-sig"))
    except RecursionError:
        raise ValueError(f"{where!r} is not a package.json: its JSON nests too deep") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{where!r} is not a package.json: not UTF-8 text (byte "
                         f"{e.object[e.start:e.start + 1]!r} at {e.start})") from None
    except ValueError as e:
        raise ValueError(f"{where!r} is not a package.json: not JSON "
                         f"({str(e).splitlines()[0] if str(e) else 'empty'})") from None


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        text = "..."
    return text if len(text) <= 40 else text[:37] + "..."
