"""In the browser: a static site that runs a bundle with onnxruntime-web, and a local
preview server that sends what multi-threaded WebAssembly needs.

`write_site(bundle, out)` writes, atomically (`atomic.atomic_directory`):

    SITE/
      index.html          the demo page: pick or drop an image, top-k, latency, backend
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
vit_deploy/web_assets/ (setup.py puts it there; web_files.py lists what it holds). No
network either way.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import mmap
import os
import posixpath
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from vit_deploy.atomic import atomic_directory, repository_record
from vit_deploy.runtime.references import REFERENCES_ROLE
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.model_scan import inspect_model
from vit_deploy.web_files import (ENTRIES, LIB_DIR, MODULE, NODE_ONLY, ORT_DIST, package_string,  # noqa: F401
                                  ORT_FILES, ORT_PACKAGE, ORT_WASM_ONLY, PACKAGED_DIR, PAGE,
                                  site_modules)

log = logging.getLogger(__name__)

WEB_FORMAT = "vit-deploy-web"
WEB_RECORD = "web.json"  # beside the site's copy of the manifest; the runtime reads it
BUNDLE_DIR = "bundle"
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

# What a host must send for multi-threaded WebAssembly (SharedArrayBuffer needs a
# cross-origin isolated page), and the MIME types browsers insist on for modules and
# streaming WebAssembly compilation.
ISOLATION_HEADERS = {"Cross-Origin-Opener-Policy": "same-origin",
                     "Cross-Origin-Embedder-Policy": "require-corp",
                     "Cross-Origin-Resource-Policy": "same-origin"}
MIME_TYPES = {".html": "text/html; charset=utf-8", ".mjs": "text/javascript",
              ".js": "text/javascript", ".wasm": "application/wasm",
              ".json": "application/json", ".onnx": "application/octet-stream",
              ".data": "application/octet-stream", ".png": "image/png", ".jpg": "image/jpeg",
              ".txt": "text/plain; charset=utf-8", "": "application/octet-stream"}


@dataclass(frozen=True)
class WebSources:
    """Where the JavaScript comes from: ROOT/src (ours) and ROOT/node_modules (npm ci), with
    ROOT the repository's web/ or the wheel's vit_deploy/web_assets/ (the same layout)."""

    root: Path

    @classmethod
    def find(cls) -> WebSources:
        """VIT_DEPLOY_WEB_DIR; else the repository's web/ in a source checkout (an editable
        install too); else the copy the installed wheel carries."""
        package = Path(__file__).resolve().parent
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
              "model_bytes": sizes}
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


# -- the local preview server ------------------------------------------------------------
PREVIEW_TIMEOUT_S = 10.0  # for a request's line and headers, and for any one read or write
PREVIEW_CONNECTIONS = 64  # at once; past that the oldest one waiting for a request makes way


def site_files(root: str | Path) -> frozenset[str]:
    """The files the site's manifest lists (what write_site wrote, POSIX paths relative to
    the site): all the preview server serves. FileNotFoundError if `root` is not a site
    written by `vit-deploy web`."""
    root = Path(root)
    what = f"{str(root)!r} is not a site written by `vit-deploy web`"
    if not (root / PAGE).is_file():
        raise FileNotFoundError(f"{str(root / PAGE)!r} is missing: {what}")
    try:
        record = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"{str(root / MANIFEST_NAME)!r} cannot be read ({e}): "
                                f"{what}") from None
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or PAGE not in files:
        raise FileNotFoundError(f"{str(root / MANIFEST_NAME)!r} lists no files (expected "
                                f"{PAGE} among them): {what}")
    # The bundle's own manifest.json is written by write_site but not listed: the record
    # leaves every file named manifest.json out (it is the record's own name).
    return frozenset(files) | {f"{BUNDLE_DIR}/{MANIFEST_NAME}"}


class SiteHandler(SimpleHTTPRequestHandler):
    """The site's listed files only (`files`, from its manifest), with the MIME types
    modules and WebAssembly need and, unless `isolation` is off, the COOP/COEP headers
    that make the page cross-origin isolated. Anything else is 404: unlisted files,
    dotfiles, directories, and a listed name that resolves through a symlink (out of the
    site or not). A request's line and headers must arrive within `timeout` seconds (a
    byte every few seconds is not a request), and a connection silent that long is
    closed."""

    extensions_map = MIME_TYPES
    isolation = True
    files: frozenset[str] = frozenset()
    timeout = PREVIEW_TIMEOUT_S  # socket timeout per read (StreamRequestHandler applies it)
    server: SiteServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own reader: one that keeps the deadline instead
        self.reader = _DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self.reader)

    def handle_one_request(self) -> None:
        self.reader.deadline = time.monotonic() + self.timeout
        self.server.waiting(self.request, True)
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()  # reads the headers
        self.reader.deadline = None
        self.server.waiting(self.request, False)
        return ok

    def site_path(self) -> str | None:
        """The real path of the requested file if the site lists it and no symlink is on
        the way to it, else None."""
        raw = unquote(urlsplit(self.path).path)
        if raw.endswith("/") and raw != "/":  # a directory's name: never served
            return None
        name = posixpath.normpath(raw).lstrip("/")
        if name in ("", "."):
            name = PAGE
        if name not in self.files:
            return None
        root = os.path.realpath(self.directory)
        full = os.path.join(root, *name.split("/"))
        if os.path.realpath(full) != full or not os.path.isfile(full):
            return None
        return full

    def translate_path(self, path: str) -> str:
        return self.site_path() or os.devnull  # only reached after send_head's check

    def send_head(self):
        if self.site_path() is None:
            self.send_error(404, "Not a file of this site")
            return None
        return super().send_head()

    def end_headers(self) -> None:
        if self.isolation:
            for key, value in ISOLATION_HEADERS.items():
                self.send_header(key, value)
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def list_directory(self, path):  # a site, not a file browser
        self.send_error(404, "No directory listing")

    def log_message(self, format: str, *args) -> None:
        pass  # quiet: the command prints its URL; a browser's requests are not news


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each within `timeout` seconds and, while `deadline` is set (a
    request's line and headers are arriving), within what is left until it: a per-read
    timeout alone lets a client that sends a byte every few seconds hold a connection."""

    def __init__(self, sock: socket.socket, timeout: float):
        self.sock, self.timeout = sock, timeout
        self.deadline: float | None = None  # time.monotonic()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        wait = self.timeout
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError(f"the request did not arrive within {self.timeout:g} s")
        self.sock.settimeout(wait)
        try:
            return self.sock.recv_into(buffer)
        finally:
            self.sock.settimeout(self.timeout)  # what writes get


class SiteServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once (a thread and a
    descriptor each is what a client could pile up). Past that, a new connection closes
    the oldest one still waiting for its request (idle, or headers arriving slowly), else
    it is closed itself: slow clients cannot keep a browser's GET out. A client that goes
    away mid-answer is one debug line, not a traceback."""

    daemon_threads = True
    request_queue_size = 128  # the accept backlog (socketserver's 5: a burst waits 1 s+)

    def __init__(self, address, handler, max_connections: int = PREVIEW_CONNECTIONS):
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.max_connections = max_connections
        self.lock = threading.Lock()
        self.live: dict[socket.socket, bool] = {}  # oldest first: waiting for a request?
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        with self.lock:
            if len(self.live) >= self.max_connections:
                victim = next((s for s, waiting in self.live.items() if waiting), None)
                if victim is None:  # every one is being answered
                    super().shutdown_request(request)
                    return
                del self.live[victim]
                try:  # its thread's read ends (EOF) and it closes the socket
                    victim.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.live[request] = True
        super().process_request(request, client_address)

    def waiting(self, request, waiting: bool) -> None:
        """Whether this connection is waiting for a request (then it may make way)."""
        with self.lock:
            if request in self.live:
                self.live[request] = waiting

    def shutdown_request(self, request) -> None:
        with self.lock:  # not closed while process_request may be shutting it down
            self.live.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """One line, never a traceback: a debug line for a client that went away or was
        too slow (a browser cancels requests all the time), a warning for anything else."""
        e = sys.exc_info()[1]
        what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if isinstance(e, (ConnectionError, TimeoutError)):
            log.debug("preview: %s went away: %s", client_address[0], what)
        else:
            log.warning("preview: a request from %s failed: %s", client_address[0], what)


def make_server(root: str | Path, host: str = "127.0.0.1", port: int = 8080, *,
                isolation: bool = True, timeout: float = PREVIEW_TIMEOUT_S,
                max_connections: int = PREVIEW_CONNECTIONS) -> SiteServer:
    """A preview server for the site at `root` (not yet serving: call serve_forever)."""
    root = Path(root)
    files = site_files(root)
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    handler = type("Handler", (SiteHandler,), {"isolation": isolation, "files": files,
                                               "timeout": timeout})
    return SiteServer((host, port), functools.partial(handler, directory=str(root)),
                      max_connections)


def serve_site(root: str | Path, host: str = "127.0.0.1", port: int = 8080, *,
               isolation: bool = True, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve `root` until interrupted; `on_ready(url)` once the port is bound (port 0: any)."""
    server = make_server(root, host, port, isolation=isolation)
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    if on_ready:
        on_ready(f"http://{shown}:{bound_port}/")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
