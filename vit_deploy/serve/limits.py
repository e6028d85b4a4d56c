"""What one request may cost: the `Limits` dataclass (carried by the app to `serve`, which
reads its connection limits), the body budget (bodies parsed at once, bytes held until
answered), and reading a body or an image within them.

Sizes are checked from what is declared before anything is read or decoded
(Content-Length, image dimensions from the image header); bodies are counted as they
arrive (chunked uploads too). Nothing shared is held on a client's clock: a body holds
only the bytes that have arrived, and a parsing slot once all of it has."""

import io
import resource
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from PIL import Image
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from vit_deploy.serve.errors import Failure, busy

MAX_IMAGE_BYTES = 20 * 1024 * 1024
# A v2 infer body (after any Content-Encoding): a batch of 8 3x448x448 FP32 images is 19 MB
# binary, about 55 MB as JSON numbers. Over this: 413.
MAX_INFER_BYTES = 64 * 1024 * 1024
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers around the one image
SHUTDOWN_GRACE_S = 10  # on Ctrl-C, requests in flight get this long before they are cancelled


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one client may cost the server. Timeouts in seconds; `max_connections` None:
    from the descriptor limit (`connection_plan()`)."""

    header_timeout_s: float = 10.0  # request line + headers, from connect or the last answer
    body_timeout_s: float = 60.0  # the whole body, from its headers (64 MB at ~1 MB/s)
    min_body_rate: float = 8 * 1024  # bytes/s a body must average over each body_window_s
    body_window_s: float = 5.0
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    max_connections: int | None = None
    max_bodies: int = 32  # request bodies being parsed at once (once all of each arrived)
    max_body_bytes: int = 256 * 1024 * 1024  # of bodies held, as they arrive to the answer
    max_image_bytes: int = MAX_IMAGE_BYTES
    max_image_pixels: int = 24_000_000  # width x height from the header (6000 x 4000)
    max_infer_bytes: int = MAX_INFER_BYTES
    max_json_bytes: int = 8 * 1024 * 1024  # of a v2 JSON header outside its number arrays
    # the longest side of a v2 image tensor (413 above; `serve --max-size`); None: make_app
    # takes the bundle's largest checked size (largest_checked_side)
    max_side: int | None = None

    def __post_init__(self) -> None:
        bad = [f"{k}={v!r}" for k, v in vars(self).items()
               if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                     or v <= 0)]
        if bad:
            raise ValueError(f"limits must be positive numbers, got {', '.join(bad)}")
        if self.max_body_bytes < max(self.max_infer_bytes, self.max_image_bytes):
            raise ValueError(f"max_body_bytes ({self.max_body_bytes}) must hold at least one "
                             f"largest request (max_infer_bytes {self.max_infer_bytes}, "
                             f"max_image_bytes {self.max_image_bytes})")


def connection_plan(limits: Limits) -> tuple[int, int]:
    """(connections, accept backlog) that fit the process's descriptor limit (soft
    RLIMIT_NOFILE). asyncio accepts up to `backlog` connections per loop pass, and a new
    connection reaches the limit (connection_made) two or three passes later, so three
    backlogs must fit beside the connections: backlog an eighth of the descriptors (16 to
    2048), connections what is left less 32 for the model, logs, pipes and the event loop
    (at most 4096), or `limits.max_connections` if given."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    backlog = max(16, min(2048, soft // 8))
    if limits.max_connections is not None:
        return limits.max_connections, backlog
    return max(8, min(4096, soft - 3 * backlog - 32)), backlog



class BodyBudget:
    """How many request bodies are being parsed at once (`max_bodies`), and how many bytes
    of bodies are held from their arrival until their request is answered
    (`max_body_bytes`): past either, Failure(503) with Retry-After. A body takes its slot
    once all of it has arrived and its bytes as they arrive, never what it only declares:
    a client that sends slowly holds next to nothing, so slow clients cannot deny fast
    ones. Used from the event loop only."""

    def __init__(self, max_bodies: int, max_bytes: int):
        self.max_bodies, self.max_bytes = max_bodies, max_bytes
        self.bodies = self.bytes = 0

    def claim(self) -> "BodyClaim":
        return BodyClaim(self)


class BodyClaim:
    """One request's share of a BodyBudget: bytes until `release()`, a parsing slot from
    `arrived()` until `parsed()`."""

    def __init__(self, budget: BodyBudget):
        self.budget, self.bytes, self.parsing = budget, 0, False

    def fits(self, total: int) -> None:
        """Failure(503) now, before reading, if `total` bytes could not be held beside what
        is held now (nothing is reserved: a declared length is only a promise)."""
        if self.budget.bytes - self.bytes + total > self.budget.max_bytes:
            raise busy(f"{self.budget.bytes} bytes of requests are held and this one needs "
                       f"{total} (the limit is {self.budget.max_bytes})")

    def need(self, total: int) -> None:
        """This request holds `total` bytes now (it only grows); Failure(503) if the
        budget cannot take them."""
        extra = total - self.bytes
        if extra <= 0:
            return
        self.fits(total)
        self.budget.bytes += extra
        self.bytes = total

    def arrived(self) -> None:
        """The whole body is here: a parsing slot, or Failure(503) if all are taken."""
        if self.parsing:
            return
        if self.budget.bodies >= self.budget.max_bodies:
            raise busy(f"{self.budget.max_bodies} request bodies are being parsed (the limit)")
        self.budget.bodies += 1
        self.parsing = True

    def parsed(self) -> None:
        if self.parsing:
            self.parsing = False
            self.budget.bodies -= 1

    def release(self) -> None:
        self.parsed()
        self.budget.bytes -= self.bytes
        self.bytes = 0


async def read_body(request: Request, limit: int, what: str = "image",
                    claim: BodyClaim | None = None) -> bytes:
    """The body, counted chunk by chunk: Failure(413) as soon as it passes `limit` bytes,
    whatever content-length said (or did not say, for a chunked upload). With a claim,
    a declared length that cannot fit is 503 before the first byte is read, the bytes are
    claimed as they arrive, and a parsing slot once all of them have."""
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise Failure(413, f"{what} of {declared} bytes is over the limit of {limit} bytes")
    if claim is not None and declared:
        claim.fits(declared)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Failure(413, f"{what} is over the limit of {limit} bytes (got {size} bytes "
                               f"so far)")
        if claim is not None:
            claim.need(size)
        chunks.append(chunk)
    if claim is not None:
        claim.arrived()
    return b"".join(chunks)


async def _replay(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _multipart_image(request: Request, limit: int, claim: BodyClaim | None) -> bytes:
    body = await read_body(request, limit + MULTIPART_OVERHEAD, claim=claim)
    try:
        form = await MultiPartParser(request.headers, _replay(body), max_files=1,
                                     max_fields=16).parse()
    except MultiPartException as e:
        raise Failure(400, f"bad multipart body ({e.message}): send exactly one file "
                           f"part") from None
    try:
        files = [v for v in form.values() if isinstance(v, UploadFile)]
        if len(files) != 1:
            raise Failure(400, f"send exactly one file part, got {len(files)}")
        return await files[0].read()
    finally:
        await form.close()


def _declared_length(request: Request) -> int | None:
    text = request.headers.get("content-length")
    if text is None:
        return None
    if not text.strip().isdigit():
        raise Failure(400, f"content-length must be a number of bytes, got {text!r}")
    return int(text)


async def read_image(request: Request, limits: Limits | None = None,
                     claim: BodyClaim | None = None) -> bytes:
    """The image bytes of a /predict request, or Failure(4xx) saying what was wrong. Its
    dimensions are read from the image header (nothing decoded): over
    `limits.max_image_pixels`, Failure(413)."""
    limits = limits or Limits()
    limit = limits.max_image_bytes
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        data = await _multipart_image(request, limit, claim)
    elif ctype.startswith(("image/", "application/octet-stream")):
        data = await read_body(request, limit, claim=claim)
    else:
        raise Failure(415, f"content type must be an image/*, application/octet-stream or "
                           f"multipart/form-data, got {ctype or 'none'!r}")
    if len(data) > limit:
        raise Failure(413, f"image of {len(data)} bytes is over the limit of {limit}")
    if not data:
        raise Failure(400, "empty request body: send an image")
    check_image_header(data, limits.max_image_pixels)
    return data


def check_image_header(data: bytes, max_pixels: int) -> None:
    """Failure(413) if the image header declares more than `max_pixels` pixels; reads the
    header only (what Pillow's open reads), decodes nothing. Bytes Pillow cannot open pass:
    the decoder answers them 400 with its own reason."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError as e:  # Pillow's own bound, past ours anyway
        raise Failure(413, f"image is over Pillow's decompression-bomb limit ({e})") from None
    except Exception:  # not an image Pillow knows (or a hostile header): the decoder says why
        return
    if width * height > max_pixels:
        raise Failure(413, f"image is {width}x{height} = {width * height} pixels, over this "
                           f"server's limit of {max_pixels} pixels (resize it first)")


def largest_checked_side(manifest: Any) -> int | None:
    """The longest side of the sizes a bundle was checked at (deploy, native, its golden
    references' cases): the largest a server takes by default. None: no manifest."""
    if manifest is None or getattr(manifest, "naflex", False):
        return None
    sizes = [manifest.deploy_resolution, manifest.native_resolution]
    if manifest.references is not None:
        sizes += [c.resolution for c in manifest.references.cases]
    return max(max(hw) for hw in sizes)
