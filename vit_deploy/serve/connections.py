"""Protections at the connection level, below the app (`serve` installs them):

- `GuardedH11Protocol`, uvicorn's h11 protocol with deadlines: the request line and
  headers must arrive within `header_timeout_s` (from the connection, or from the previous
  answer on a kept-alive one), a body within `body_timeout_s` of its headers and at
  `min_body_rate` bytes/s over each `body_window_s`, else 408 and the connection closes;
- `Connections`: at most `max_connections` are open, and a new one past that closes the
  oldest one that is not being answered (idle, or half-open), else the one that has been
  sending its body longest (408): a slow sender never keeps a fast client out;
- `RepeatFilter`: a message repeated by a flood (accept errors, invalid requests) is
  logged once, then at most once per `LOG_REPEAT_S` with a count of what was left out."""

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from vit_deploy.serve.limits import Limits

log = logging.getLogger(__name__)

LOG_REPEAT_S = 10.0  # a repeated log message: once, then at most once per this many seconds
TIMED_OUT = "vit_deploy.timed_out"  # set in the ASGI scope when the server closed a slow request


class RepeatFilter(logging.Filter):
    """Lets a message through the first time, then at most once per `every` seconds per
    (logger, level, message template), with how many were left out in between and
    without their tracebacks: a flood of accept errors or invalid requests costs a few
    lines, not gigabytes."""

    def __init__(self, every: float = LOG_REPEAT_S, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every, self.clock = every, clock
        self.seen: dict[tuple[str, int, str], list[float]] = {}  # key -> [last shown, skipped]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = self.clock()
        with self._lock:
            seen = self.seen.get(key)
            if seen is None:
                if len(self.seen) >= 1000:  # fixed memory, whatever the messages
                    self.seen.clear()
                self.seen[key] = [now, 0]
                return True
            if now - seen[0] < self.every:
                seen[1] += 1
                return False
            skipped, seen[:] = int(seen[1]), [now, 0]
        if skipped:
            record.msg = f"{record.msg} [repeated: {skipped} more like this in the last " \
                         f"{self.every:g} s were not logged]"
            record.exc_info, record.exc_text = None, None
        return True


@contextlib.contextmanager
def quiet_floods(every: float = LOG_REPEAT_S) -> Iterator[RepeatFilter]:
    """A RepeatFilter on the loggers a flood of bad connections writes to, while serving:
    uvicorn's, asyncio's and each of this package's (a logger's filters do not see its
    children's records, so each module's logger gets it)."""
    flt = RepeatFilter(every)
    package = __name__.rpartition(".")[0]
    ours = [n for n in list(logging.root.manager.loggerDict) if n.startswith(package + ".")]
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "asyncio", *sorted(ours))]
    for logger in loggers:
        logger.addFilter(flt)
    try:
        yield flt
    finally:
        for logger in loggers:
            logger.removeFilter(flt)


class Connections:
    """The open connections of one server, oldest first, and their limit. Past the limit
    a new connection closes the oldest one that is not being answered (half-open, idle
    between requests, or draining a body already answered), else the one that has been
    sending its body longest (408: a fast body takes a moment, so that one is the slowest);
    if every one is being answered, the new one is closed."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open: dict["GuardedH11Protocol", None] = {}  # insertion order: oldest first
        self.closed = 0  # by the limit

    def admit(self, conn: "GuardedH11Protocol") -> None:
        self.open[conn] = None
        if len(self.open) <= self.limit:
            return
        others = [c for c in self.open if c is not conn]
        victim = next((c for c in others if c.idle()), None) or min(
            (c for c in others if c.reading_body()), key=lambda c: c.body_since, default=conn)
        self.open.pop(victim, None)
        self.closed += 1
        log.warning("%d connections are open (the limit): closed the oldest one not being "
                    "answered, or the slowest body (%d so far)", self.limit, self.closed)
        if victim.reading_body():
            victim.time_out(f"{self.limit} connections are open (the server's limit) and "
                            f"this request's body was the slowest to arrive")
        else:
            victim.transport.close()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines and a bound on connections (`serve` makes a
    subclass per server with `limits` and `registry` set):
    - waiting for a request (connect, or the previous answer): the request line and headers
      within `header_timeout_s`, else 408 (if some of them came) and close;
    - reading a body: all of it within `body_timeout_s` of the headers, and at least
      `min_body_rate` bytes/s over each `body_window_s` (a trickle is cut in seconds, not
      at the body timeout), else 408 (if the app has not answered yet) and close; the app
      reads a disconnect and stops;
    - the app working on a request: no deadline here (the batcher's queue is bounded)."""

    limits: Limits
    registry: Connections

    _timer: asyncio.TimerHandle | None = None
    _phase: str | None = None
    body_since = 0.0  # loop time the current body's headers arrived
    _window_bytes = 0  # of the body, since the last rate check

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.registry.admit(self)
        self._update()

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.open.pop(self, None)
        self._set_timer(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase == "body":
            self._window_bytes += len(data)
        super().data_received(data)
        self._update()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update()

    def idle(self) -> bool:
        """Not being answered: no request, or its answer is complete."""
        return self.cycle is None or self.cycle.response_complete

    def reading_body(self) -> bool:
        """Its body is arriving and the app has not answered it yet."""
        return self._phase == "body" and not self.idle()

    def _current_phase(self) -> str | None:
        if self.transport.is_closing():
            return None
        their = self.conn.their_state
        if their is h11.IDLE:
            return "headers"
        if their is h11.SEND_BODY:
            return "body"
        return None

    def _update(self) -> None:
        phase = self._current_phase()
        if phase != self._phase:
            self._phase = phase
            self._set_timer(phase)

    def _set_timer(self, phase: str | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if phase == "headers":
            self._timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_late)
        elif phase == "body":
            self.body_since, self._window_bytes = self.loop.time(), 0
            self._timer = self.loop.call_later(
                min(self.limits.body_window_s, self.limits.body_timeout_s), self._body_check)

    def _headers_late(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._current_phase() != "headers":
            return
        if self.conn.trailing_data[0]:  # part of a request came, not all of it
            self._write_408(f"the request line and headers did not arrive within "
                            f"{self.limits.header_timeout_s:g} s (the header timeout)")
        log.info("closed a connection: its headers did not arrive in time")
        self.transport.close()

    def _body_check(self) -> None:
        """Past the body timeout, or under the minimum rate over the last window (unless
        the app was not reading, its buffer full): 408. Else check again a window on."""
        self._timer = None
        if self.transport.is_closing() or self._current_phase() != "body":
            return
        limits = self.limits
        left = self.body_since + limits.body_timeout_s - self.loop.time()
        if left <= 0.001:
            self.time_out(f"the request body did not arrive within {limits.body_timeout_s:g} "
                          f"s of its headers (the body timeout)")
            return
        if self._window_bytes < limits.min_body_rate * limits.body_window_s \
                and not self.flow.read_paused:
            self.time_out(f"the request body arrived at under {limits.min_body_rate:g} bytes/s "
                          f"({self._window_bytes} bytes in {limits.body_window_s:g} s; the "
                          f"minimum body rate)")
            return
        self._window_bytes = 0
        self._timer = self.loop.call_later(min(limits.body_window_s, left), self._body_check)

    def time_out(self, message: str) -> None:
        """Close this connection while its body is arriving: 408 with `message` if the app
        has not answered yet, and the app's next receive is a disconnect."""
        if self.transport.is_closing():
            return
        self._set_timer(None)
        if self.cycle is not None and not self.cycle.response_started:
            self.cycle.scope[TIMED_OUT] = "body"  # type: ignore[literal-required]
            self.cycle.disconnected = True  # the app's next receive is a disconnect
            self.cycle.message_event.set()
            self._write_408(message)
        log.info("closed a connection: %s", message)
        self.transport.close()

    def _write_408(self, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json"
                             b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
