"""The v2 JSON header scanner (serve/tensor_json.py) in memory bounded by the body: a long
JSON string cost 115 bytes a character before json.loads (issue: a 63 MB string field took
the server past 4 GB and it was killed); now a small multiple of the body, whatever the
string holds (plain characters, escapes, brackets)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from vit_deploy.serve.tensor_json import load_header

MEASURE = """
import resource, sys
from vit_deploy.serve.errors import Failure
from vit_deploy.serve.tensor_json import load_header
n = int(sys.argv[2])
inner = {"plain": b"A" * n, "escapes": b'\\\\"' * (n // 2), "brackets": b"[1,2]" * (n // 5)}
body = b'{"pad": "' + inner[sys.argv[1]] + b'", "inputs": []}'
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_header(body, 64 * 2**20)
except Failure:
    pass
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.parametrize("kind", ["plain", "escapes", "brackets"])
def test_a_long_string_costs_a_small_multiple_of_its_length(kind):
    n = 20 * 2**20  # 20 MB of string: 2.3 GB before
    r = subprocess.run([sys.executable, "-c", MEASURE, kind, str(n)], capture_output=True,
                       text=True, timeout=120, check=True)
    grew = int(r.stdout.strip())
    assert grew <= 4 * n, f"{kind}: {grew / 2**20:.0f} MB for a {n / 2**20:.0f} MB string"


def test_strings_holding_quotes_and_brackets_stay_strings():
    data = list(range(300))  # long enough to be cut out as a span
    body = json.dumps({"id": 'a "quoted" [1, 2] \\ string', "inputs": [
        {"name": "x", "shape": [300], "datatype": "FP32", "data": data}]}).encode()
    parsed, spans = load_header(body, 2**20)
    assert parsed["id"] == 'a "quoted" [1, 2] \\ string'
    i = spans.ref(parsed["inputs"][0]["data"])
    np.testing.assert_array_equal(spans.parse(i, np.float32), np.arange(300, dtype=np.float32))
