"""How messages name keys and counts (blocks.0-1, '2 blocks', lists cut at five), and the
arithmetic every reader shares: numbered blocks, square grids, the MLP ratio."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any


def _indices(state: dict[str, Any], prefix: str) -> list[int]:
    """Sorted N of the keys `prefix`N.… (blocks.N., encoder.layer.N.)."""
    pattern = re.compile(re.escape(prefix) + r"(\d{1,9})\.")
    return sorted({int(m.group(1)) for k in state if (m := pattern.match(k))})


def _numbered(idx: list[int], n: int) -> bool:
    """Whether the sorted, distinct `idx` are exactly 0..n-1 (without building range(n): a
    config may say a depth of two billion)."""
    return len(idx) == n and (n == 0 or idx[-1] == n - 1)


def _describe(prefix: str, idx: list[int]) -> str:
    """'blocks.0-1', 'blocks.0, 2; blocks.1 missing', 'none'."""
    if not idx:
        return "none"
    spans: list[list[int]] = []
    for i in idx:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    def text(ss: list[list[int]]) -> str:
        return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ss)

    gaps = ([[0, spans[0][0] - 1]] if spans[0][0] > 0 else []) + [
        [a[1] + 1, b[0] - 1] for a, b in itertools.pairwise(spans)]
    missing = f"; {prefix}{text(gaps[:5])}{' ...' if len(gaps) > 5 else ''} missing" if gaps else ""
    return f"{prefix}{text(spans[:5])}{' ...' if len(spans) > 5 else ''}{missing}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _and_more(items: list) -> str:
    return f" (and {_count(len(items) - 1, 'more block')})" if len(items) > 1 else ""


def _some(items: list, n: int = 5) -> str:
    return f"{items[:n]}" + (f" (+{len(items) - n} more)" if len(items) > n else "")


def _mlp_ratio(hidden: int, width: int) -> float:
    """The ratio the model turns back into `hidden` (int(width * ratio) == hidden): hidden /
    width rounds down for some pairs (11, 15), so nudge it up by ulps until it does not."""
    ratio = hidden / width
    while int(width * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def _square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n
