"""The local preview server of a site written by `vit-deploy web` (site.py): only the files
the site's manifest lists, with the MIME types modules and WebAssembly need and the headers
that make the page cross-origin isolated (multi-threaded WebAssembly); request heads within
a deadline, a cap on connections where the oldest waiting one makes way."""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import posixpath
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.website.files import PAGE

log = logging.getLogger(__name__)

BUNDLE_DIR = "bundle"  # where a site keeps the bundle (site.py writes it)

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
