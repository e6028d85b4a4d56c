"""Tensor data in a v2 JSON header, parsed without a Python float per value.

In a v2 JSON header, tensor data is the bulk: long arrays of plain numbers. They are cut
out before json.loads (which would make a Python float of each value, ~16x the text) and
parsed by numpy straight into the tensor, once the declared shape says how many values
to expect. Strings are matched first, so brackets inside a string are never taken for
an array."""

import json
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from vit_deploy.serve.errors import Failure, describe

# A string's characters are matched by one class repeat between escapes ("unrolled"), and
# possessively where re has it (3.11+): the old `(?:[^"\\]|\\.)*` kept a backtracking
# entry per character (a 5 MB string cost 573 MB before json.loads). Python 3.10 keeps one
# per escape sequence only.
_OWN = b"+" if sys.version_info >= (3, 11) else b""
_STRING_OR_NUMBERS = re.compile(rb'"[^"\\]*%s(?:\\.[^"\\]*%s)*%s"|\[[-+0-9.eE,\s]*%s\]'
                                % (_OWN, _OWN, _OWN, _OWN))
_SPAN_MIN = 256  # shorter arrays (shapes, small data) stay in the JSON


def bad_request(message: str) -> Failure:
    return Failure(400, message)


def shape_text(shape: Any) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (what a client sent)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    return "an array" if isinstance(value, list) else "an object"


@dataclass
class Spans:
    """The number arrays cut out of a JSON header: (start, end) of each one's text between
    its brackets, and the marker key that stands for them in the rest (unguessable, so a
    client cannot forge a reference)."""

    text: bytes
    places: list[tuple[int, int]]
    key: str
    used: set[int]

    def ref(self, node: Any) -> int | None:
        """The index of the span a parsed node stands for, or None."""
        if isinstance(node, dict) and len(node) == 1 and self.key in node:
            return node[self.key]
        return None

    def count(self, i: int) -> int:
        start, end = self.places[i]
        return self.text.count(b",", start, end) + 1

    def parse(self, i: int, dtype: np.dtype) -> np.ndarray | None:
        """The span's numbers as a 1-D array, or None if it is not a list of numbers."""
        start, end = self.places[i]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns (and stops) on text it cannot read
            try:
                return np.fromstring(self.text[start:end], dtype=dtype, sep=",")
            except (ValueError, DeprecationWarning, RuntimeWarning):
                return None


def load_header(header: bytes, max_json_bytes: int) -> tuple[Any, Spans]:
    """json.loads of a v2 JSON header with its long number arrays cut out (see above);
    Failure(413) if what remains is over `max_json_bytes`, Failure(400) if not JSON."""
    spans = Spans(header, [], "\0" + os.urandom(8).hex(), set())
    pieces: list[tuple[int, int] | bytes] = []
    at = kept = 0
    for m in _STRING_OR_NUMBERS.finditer(header):
        if header[m.start()] != ord("[") or m.end() - m.start() < _SPAN_MIN:
            continue
        marker = json.dumps({spans.key: len(spans.places)}).encode()
        pieces += [(at, m.start()), marker]
        kept += m.start() - at + len(marker)
        spans.places.append((m.start() + 1, m.end() - 1))
        at = m.end()
    pieces.append((at, len(header)))
    kept += len(header) - at
    if kept > max_json_bytes:
        raise Failure(413, f"the request's JSON is {kept} bytes besides its arrays of plain "
                           f"numbers, over the limit of {max_json_bytes} (send tensor data as "
                           f"arrays of numbers, or as binary data)")
    text = b"".join(header[p[0]:p[1]] if isinstance(p, tuple) else p for p in pieces)
    try:
        return json.loads(text), spans
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError
        raise bad_request(f"the request is not valid JSON: {describe(e)}") from None


def _data_shape(name: str, node: Any, spans: Spans) -> tuple[int, ...]:
    """The shape of an input's (maybe nested) data, spans counted by their commas; 400 if
    it holds anything but numbers or is ragged."""
    i = spans.ref(node)
    if i is not None:
        if not isinstance(i, int) or not 0 <= i < len(spans.places) or i in spans.used:
            raise bad_request(f"input {name!r}: data is malformed")
        spans.used.add(i)
        return (spans.count(i),)
    if isinstance(node, bool) or not isinstance(node, (int, float, list)):
        raise bad_request(f"input {name!r}: data must hold only numbers, got {json_type(node)}")
    if not isinstance(node, list):
        return ()
    if all(type(v) in (int, float) for v in node):
        return (len(node),)
    shapes = {_data_shape(name, v, spans) for v in node}
    if len(shapes) > 1:
        raise bad_request(f"input {name!r}: data is not a regular array of numbers (ragged "
                          f"nesting)")
    return (len(node), *(shapes.pop() if shapes else ()))


def _fill(name: str, node: Any, spans: Spans, out: np.ndarray, at: int) -> int:
    """Write a node's numbers into the flat `out` from `at`; returns where it ended."""
    i = spans.ref(node)
    if i is not None:
        values = spans.parse(i, out.dtype)
        if values is None or len(values) != spans.count(i):
            raise bad_request(f"input {name!r}: data is not a JSON array of numbers (an array of "
                              f"{spans.count(i)} items could not be read as numbers)")
    elif isinstance(node, list) and all(type(v) in (int, float) for v in node):
        with np.errstate(over="ignore", invalid="ignore"):  # out of range: inf, refused later
            values = np.asarray(node, dtype=np.float64).astype(out.dtype)
    elif isinstance(node, list):
        for v in node:
            at = _fill(name, v, spans, out, at)
        return at
    else:
        values = np.asarray([node], dtype=np.float64).astype(out.dtype)
    out[at:at + len(values)] = values
    return at + len(values)


def json_tensor(name: str, data: Any, shape: list[int], dtype: np.dtype,
                 spans: Spans) -> np.ndarray:
    """An input's "data" (flat or nested, row-major) as an array of `shape`: the values are
    counted before any of them is parsed."""
    if not isinstance(data, list) and spans.ref(data) is None:
        raise bad_request(f"input {name!r}: data must be a JSON array of numbers, got "
                          f"{json_type(data)}")
    count = math.prod(_data_shape(name, data, spans))
    need = math.prod(shape)
    if count != need:
        raise bad_request(f"input {name!r}: data holds {count} values, shape {shape_text(shape)} "
                          f"needs {need}")
    i = spans.ref(data)
    if i is not None:  # one flat array of numbers (what tritonclient sends): no copy
        values = spans.parse(i, dtype)
        if values is not None and len(values) == need:
            return values.reshape(shape)
    out = np.empty(need, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        _fill(name, data, spans, out, 0)
    return out.reshape(shape)

