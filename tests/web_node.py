"""The Node.js the JavaScript tests run, checked once for them all: on PATH, with the web
package's onnxruntime-node installed (`make setup` runs `npm ci`); a test fails, never skips,
where either is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

WEB = Path(__file__).resolve().parents[1] / "web"


def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail("node is not on PATH: the web tests need Node.js >= 20 (make setup)")
    if not (WEB / "node_modules" / "onnxruntime-node").is_dir():
        pytest.fail(f"{WEB / 'node_modules'} lacks onnxruntime-node: run `make setup` (npm ci)")
    return path
