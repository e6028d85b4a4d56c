"""In the browser: a static site that runs a bundle with onnxruntime-web, and a local
preview server that sends what multi-threaded WebAssembly needs.

`write_site(bundle, out)` writes, atomically (`atomic.atomic_directory`):

    SITE/
      index.html          the demo page: pick or drop an image, top-k, latency, backend (a
                          SigLIP 2 NaFlex bundle: the image's patch grid and pooled vector)
      vit-deploy.mjs      the runtime's entry (web/src/vit-deploy.mjs): load, classify, run
      browser.mjs         the browser's own entry (the same API, nothing of Node's): the
                          page imports it by the package's name, 'vit-deploy' (import map)
      lib/                the modules both import (web/src/lib, less Node's platform module)
      bundle/             manifest.json, the chosen model files (+ external data), the
                          golden references (references.bin) if the bundle has them,
                          web.json (precisions, threads, external data, sizes)
      ort/                onnxruntime-web: WebAssembly build, WebGPU build, their .wasm
      manifest.json       every file's sha256 (so a re-run may replace the site)

Where the JavaScript comes from (`WebSources.find`): VIT_DEPLOY_WEB_DIR if set (e.g. the npm
package `vit-deploy` installed in an app, node_modules/vit-deploy); else, in
a source checkout, the repository's web/ (`npm ci` there installs the pinned
onnxruntime-web the site copies); else the copy an installed wheel carries in
vit_deploy/web_assets/ (setup.py puts it there; files.py lists what it holds). No
network either way.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vit_deploy.atomic import atomic_directory, repository_record
from vit_deploy.runtime.references import REFERENCES_ROLE
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.model_scan import inspect_model
from vit_deploy.website.preview import (BUNDLE_DIR, ISOLATION_HEADERS, MIME_TYPES,  # noqa: F401
                                    make_server, serve_site, site_files)
from vit_deploy.website.files import (ENTRIES, LIB_DIR, MODULE, NODE_ONLY, ORT_DIST, package_string,  # noqa: F401
                                  ORT_FILES, ORT_PACKAGE, ORT_WASM_ONLY, PACKAGED_DIR, PAGE,
                                  site_modules)


WEB_FORMAT = "vit-deploy-web"
WEB_RECORD = "web.json"  # beside the site's copy of the manifest; the runtime reads it
ORT_DIR = "ort"
ORT_NOTICE = """onnxruntime-web {version} (https://www.npmjs.com/package/onnxruntime-web)

MIT License

Copyright (c) Microsoft Corporation

Permission is hereby granted, free of charge, to any person obtaining a copy of this software
and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""

@dataclass(frozen=True)
class WebSources:
    """Where the JavaScript comes from: ROOT/src (ours) and ROOT/node_modules (npm ci), with
    ROOT the repository's web/ or the wheel's vit_deploy/web_assets/ (the same layout)."""

    root: Path

    @classmethod
    def find(cls) -> WebSources:
        """VIT_DEPLOY_WEB_DIR; else the repository's web/ in a source checkout (an editable
        install too); else the copy the installed wheel carries."""
        package = Path(__file__).resolve().parents[1]  # vit_deploy/
        checkout = package.parent / "web"
        if os.environ.get("VIT_DEPLOY_WEB_DIR"):
            root, where = Path(os.environ["VIT_DEPLOY_WEB_DIR"]), "VIT_DEPLOY_WEB_DIR"
        elif (checkout / "src" / MODULE).is_file():
            root, where = checkout, "the repository's web/"
        else:
            root, where = package / PACKAGED_DIR, "the installed package's web assets"
        sources = cls(root)
        for path in (*(root / "src" / name for name in ENTRIES), sources.page):
            if not path.is_file():
                raise FileNotFoundError(f"{str(path)!r} is missing from {where}: "
                                        f"`vit-deploy web` needs the repository's web/, a wheel "
                                        f"built with its web assets, or VIT_DEPLOY_WEB_DIR")
        pinned = sources.pinned_ort_version()
        installed = sources.installed_ort_version()
        if installed is None:
            raise FileNotFoundError(f"{ORT_PACKAGE} is not installed in {str(root)!r}: run "
                                    f"`make setup` (npm ci in web/)")
        if installed != pinned:
            raise ValueError(f"web/package.json pins {ORT_PACKAGE} {pinned}, but {installed} "
                             f"is installed; run `make setup` (npm ci in web/)")
        return sources

    @property
    def module(self) -> Path:
        return self.root / "src" / MODULE

    @property
    def modules(self) -> list[str]:
        """The JavaScript files the site serves, relative to web/src (POSIX paths)."""
        return site_modules(self.root)

    @property
    def page(self) -> Path:
        return self.root / "src" / PAGE

    @property
    def ort_dist(self) -> Path:
        """onnxruntime-web's dist/, found as Node finds a dependency: in root/node_modules
        (the repository's web/ after npm ci), else in the node_modules of a directory above
        (the npm package installed in an app, whose dependencies npm puts beside it)."""
        for base in (self.root, *self.root.parents):
            dist = base / ORT_DIST
            if base.name != "node_modules" and dist.is_dir():
                return dist
        return self.root / ORT_DIST

    def pinned_ort_version(self) -> str:
        return package_string(self.root / "package.json", "dependencies", ORT_PACKAGE)

    def installed_ort_version(self) -> str | None:
        path = self.ort_dist.parent / "package.json"
        if not path.exists() and not path.is_symlink():
            return None
        return package_string(path, "version")


@dataclass(frozen=True)
class SiteResult:
    path: Path
    precisions: tuple[str, ...]
    threads: int | None
    model_bytes: dict[str, int]  # precision -> bytes of its model file(s)
    ort_bytes: int  # of the WebAssembly-only files (what a browser without WebGPU loads)
    ort_version: str

    def __rich__(self) -> str:
        models = ", ".join(f"{p} {b / 1e6:.1f} MB" for p, b in self.model_bytes.items())
        return (f"wrote {self.path}: {PAGE}, {MODULE} (+ {LIB_DIR}/), {BUNDLE_DIR}/ ({models}), "
                f"{ORT_DIR}/ (onnxruntime-web {self.ort_version}; {self.ort_bytes / 1e6:.1f} MB "
                f"for WebAssembly); threads {self.threads or 'default'}")


def external_data(model: Path) -> list[str]:
    """The external-data files a model's tensors point to (relative to its directory)."""
    if model.stat().st_size == 0:
        return []
    with open(model, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data.find(b"location") < 0:  # every external tensor names its file: none here
            return []
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    tensors = list(proto.graph.initializer) + [
        a.t for n in proto.graph.node for a in n.attribute if a.HasField("t")]
    locations = {next((e.value for e in t.external_data if e.key == "location"), "")
                 for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL}
    return sorted(locations - {""})


def write_site(bundle: str | Path, out: str | Path, *, precisions: Sequence[str] = ("fp32",),
               threads: int | None = None, force: bool = False,
               sources: WebSources | None = None) -> SiteResult:
    """Write the static site for `bundle` (the first precision is the page's default)."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)  # verified: every file's size and sha256
    precisions = tuple(dict.fromkeys(precisions))
    if not precisions:
        raise ValueError("expected at least one precision, got none")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    manifest.require_models(precisions)
    sources = sources or WebSources.find()
    models: dict[str, list[str]] = {}  # precision -> [model file, external data files...]
    for precision in precisions:
        path = manifest.model_path(bundle, precision)
        inspect_model(path, manifest.files)  # refuses external data outside or unlisted
        models[precision] = [manifest.model_file(precision),
                             *(_bundle_name(bundle, path.parent / name)
                               for name in external_data(path))]
    sizes = {p: sum((bundle / f).stat().st_size for f in files) for p, files in models.items()}
    # the golden references travel with the models: the page's "check and measure" reads them
    references = sorted(name for name, entry in manifest.files.items()
                        if entry.role == REFERENCES_ROLE)
    version = sources.installed_ort_version() or ""
    record = {"format": WEB_FORMAT, "format_version": 1, "precisions": list(precisions),
              "threads": threads, "onnxruntime_web": version,
              "external_data": {p: _relative_to_model(manifest.model_file(p), files[1:])
                                for p, files in models.items()},
              "model_bytes": sizes,
              # the page runs a NaFlex bundle through NaFlex (lib/naflex.mjs): grid and pooled
              **({"naflex": True} if manifest.naflex else {})}
    with atomic_directory(out, force=force, source=bundle) as tmp:
        shutil.copy2(sources.page, tmp / PAGE)
        (tmp / LIB_DIR).mkdir()
        for name in sources.modules:
            shutil.copy2(sources.root / "src" / name, tmp / name)
        (tmp / BUNDLE_DIR).mkdir()
        shutil.copy2(bundle / MANIFEST_NAME, tmp / BUNDLE_DIR / MANIFEST_NAME)
        for name in sorted({f for files in models.values() for f in files} | set(references)):
            (tmp / BUNDLE_DIR / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(bundle / name, tmp / BUNDLE_DIR / name)
        (tmp / BUNDLE_DIR / WEB_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        (tmp / ORT_DIR).mkdir()
        for name in ORT_FILES:
            shutil.copy2(sources.ort_dist / name, tmp / ORT_DIR / name)
        (tmp / ORT_DIR / "LICENSE.txt").write_text(ORT_NOTICE.format(version=version))
        (tmp / MANIFEST_NAME).write_text(json.dumps(repository_record(tmp, bundle, "web"),
                                                    indent=2))
    ort_bytes = sum((sources.ort_dist / n).stat().st_size for n in ORT_WASM_ONLY)
    return SiteResult(Path(out), precisions, threads, sizes, ort_bytes, version)


def _bundle_name(bundle: Path, path: Path) -> str:
    """A file's name inside the bundle (external data sits beside its model)."""
    return path.resolve().relative_to(bundle.resolve()).as_posix()


def _relative_to_model(model: str, files: list[str]) -> list[str]:
    """Names as the model's tensors spell them: relative to the model's directory."""
    parent = Path(model).parent
    return [Path(f).relative_to(parent).as_posix() if parent != Path(".") else f for f in files]
