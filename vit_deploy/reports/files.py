"""Saved reports read back, safely: only a regular file of bounded size, opened without
blocking (a FIFO or /dev/zero is refused at once), and JSON refused when it holds what no
report writes (NaN, numbers out of range, nesting past a few levels). `bench --compare` and
`BenchReport.load` read through here."""

from __future__ import annotations

import json
import re
import math
from pathlib import Path
from typing import Any

from vit_deploy.reports.schema import ReportError
from vit_deploy.runtime.files import NotRegularFile, read_regular

# What a saved report may be: reports are kilobytes and nest a few levels; anything far
# past that is not a report, and is refused before it costs memory or the stack.
REPORT_MAX_BYTES = 64 << 20
REPORT_MAX_DEPTH = 32


def read_report(path: str | Path) -> bytes:
    """A saved report's bytes. Only a regular file (after symlinks) of at most
    REPORT_MAX_BYTES is read (runtime/files.py's read_regular: opened without blocking, so a
    FIFO, /dev/zero or a directory given as a report is refused at once, not read forever)."""
    where = repr(str(path))
    try:
        return read_regular(path, REPORT_MAX_BYTES)
    except NotRegularFile as e:
        got = e.kind or (f"{e.size / 2**20:.0f} MiB" if e.size is not None else "more")
        size = "" if e.kind else f" of at most {REPORT_MAX_BYTES >> 20} MiB"
        raise ReportError(f"cannot read bench report {where}: expected a JSON file{size}, "
                          f"got {got}") from None
    except OSError as e:
        raise ReportError(f"cannot read bench report {where}: {e.strerror or e}") from None


class _NotReportJSON(ValueError):
    """A JSON value no report holds (NaN, a number out of range): json.loads lets it out."""


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) >= 2**63:
        raise _NotReportJSON(f"the integer {text[:24]}{'...' if len(text) > 24 else ''} is out "
                             f"of range (a report's integers fit 64 bits)")
    return value


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotReportJSON(f"the number {text[:24]}{'...' if len(text) > 24 else ''} is out "
                             f"of range (a report's numbers are finite doubles)")
    return value


def _json_constant(text: str) -> Any:
    raise _NotReportJSON(f"{text} is not JSON (a report writes a non-finite number as null)")


def _depth(data: Any) -> int:
    """How deep lists and objects nest in `data`, without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = (value.values() if isinstance(value, dict)
                    else value if isinstance(value, list) else None)
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > REPORT_MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_report(text: str | bytes, *, source: str = "report",
                 what: str = "a vit-deploy bench report (saved with --json)") -> Any:
    """The JSON of a saved report, refused (ReportError naming `source`) when it is not JSON,
    holds NaN, ±Infinity or a number out of range, or nests deeper than REPORT_MAX_DEPTH
    (which a report never does, and which would otherwise exhaust the stack)."""
    def refuse(why: str) -> ReportError:
        return ReportError(f"{source} is not {what}: {why}")

    try:
        data = json.loads(text, parse_int=_json_int, parse_float=_json_float,
                          parse_constant=_json_constant)
    except _NotReportJSON as e:
        raise refuse(str(e)) from None
    except RecursionError:
        raise refuse(f"its JSON nests deeper than {REPORT_MAX_DEPTH} levels (a report nests "
                     f"a few)") from None
    except UnicodeDecodeError as e:
        raise refuse(f"not JSON (not UTF-8 text: byte {e.object[e.start:e.start + 1]!r} at "
                     f"{e.start})") from None
    except ValueError as e:
        raise refuse(f"not JSON ({str(e).splitlines()[0] if str(e) else 'empty'})") from None
    if _depth(data) > REPORT_MAX_DEPTH:
        raise refuse(f"its JSON nests deeper than {REPORT_MAX_DEPTH} levels (a report nests "
                     f"a few)")
    return _printable(data)


# C0 and C1 control characters, DEL, and the bidirectional overrides: a saved report's text
# is shown on a terminal, where ESC sequences recolour it, move the cursor or plant
# hyperlinks (OSC 8); none belongs in a report.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _printable(data: Any) -> Any:
    """`data` with every string (keys too) stripped of control characters (_CONTROL)."""
    if isinstance(data, str):
        return _CONTROL.sub("", data)
    if isinstance(data, list):
        return [_printable(v) for v in data]
    if isinstance(data, dict):
        return {_printable(k): _printable(v) for k, v in data.items()}
    return data
