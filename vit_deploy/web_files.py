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

from pathlib import Path

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
