"""The Node.js the JavaScript tests run, checked once for them all: on PATH, with the web
package's onnxruntime-node installed (`make setup` runs `npm ci`); a test fails, never skips,
where either is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

WEB = Path(__file__).resolve().parents[1] / "web"
CHROMIUM = "/usr/bin/chromium"  # Debian's, installed by make setup


def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail("node is not on PATH: the web tests need Node.js >= 20 (make setup)")
    if not (WEB / "node_modules" / "onnxruntime-node").is_dir():
        pytest.fail(f"{WEB / 'node_modules'} lacks onnxruntime-node: run `make setup` (npm ci)")
    return path


def chromium_node() -> str:
    """Node, after making sure Debian's Chromium is there for testing/chromium.mjs."""
    path = node()
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's chromium package "
                    f"(make setup installs it where apt-get is usable)")
    return path


def chromium_pages(node: str, job: dict, tmp_path: Path, *, timeout: float) -> list[dict]:
    """testing/chromium.mjs on `job` (written to tmp_path/job.json): the pages it reports."""
    (tmp_path / "job.json").write_text(json.dumps(job))
    r = subprocess.run([node, "testing/chromium.mjs", str(tmp_path / "job.json")], cwd=WEB,
                       capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout)["pages"]
