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


@contextlib.contextmanager
def steps(*, quiet: bool = False, title: str = "working") -> Iterator[Progress]:
    """A Progress for the command line, shown on stderr so stdout stays the result."""
    if quiet:
        yield silent
        return
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if console.is_terminal:
        start = time.perf_counter()
        with console.status(title) as status:
            yield lambda what: status.update(f"{what} ({time.perf_counter() - start:.0f} s)")
        return
    start = time.perf_counter()

    def line(what: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {what}", file=sys.stderr, flush=True)

    yield line
