"""Saying what is happening: a step is announced by calling `progress("what")`.

The library takes any `Progress` callable; the CLI picks one with `steps()`: a live
status line on a terminal, plain lines on stderr otherwise (CI logs, pipes), nothing with
`--quiet`. Torch-free.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

Progress = Callable[[str], None]


def silent(_what: str) -> None:
    """The default: libraries say nothing unless asked."""


HEARTBEAT = 10.0  # seconds: the longest a running command stays silent


@contextlib.contextmanager
def steps(*, quiet: bool = False, title: str = "working",
          heartbeat: float = HEARTBEAT) -> Iterator[Progress]:
    """A Progress for the command line, shown on stderr so stdout stays the result. A step
    that runs longer than `heartbeat` seconds is said again ("still: ...", with how long it
    has run), so a long step (the fp32 reference, a candidate's quantisation) is never
    silent for longer."""
    if quiet:
        yield silent
        return
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    start = time.perf_counter()
    if console.is_terminal:
        with console.status(title) as status:
            def show(what: str) -> None:
                status.update(f"{what} ({time.perf_counter() - start:.0f} s)")

            with _heartbeat(show, heartbeat) as say:
                yield say
        return

    def line(what: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {what}", file=sys.stderr, flush=True)

    with _heartbeat(line, heartbeat) as say:
        yield say


@contextlib.contextmanager
def _heartbeat(show: Progress, every: float) -> Iterator[Progress]:
    """`show`, and a thread that repeats the last step (with the time it has run) when
    nothing was said for `every` seconds; stopped on exit."""
    import threading

    state = {"what": "", "since": time.perf_counter(), "said": time.perf_counter()}
    lock = threading.Lock()
    done = threading.Event()

    def say(what: str) -> None:
        with lock:
            now = time.perf_counter()
            state.update(what=what, since=now, said=now)
            show(what)

    def beat() -> None:
        while not done.wait(min(1.0, every / 4)):
            with lock:
                now = time.perf_counter()
                if state["what"] and now - state["said"] >= every:
                    state["said"] = now
                    show(f"still: {state['what']} ({now - state['since']:.0f} s in this step)")

    thread = threading.Thread(target=beat, name="progress-heartbeat", daemon=True)
    thread.start()
    try:
        yield say
    finally:
        done.set()
        thread.join()
