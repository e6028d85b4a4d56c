"""The JavaScript runtime's constants are Python's: each entry of web/src is imported in
Node, what it exports in UPPER_CASE is printed as JSON and compared with the value in
vit_deploy.runtime (contract, config, sizes, cpu, preprocess) or vit_deploy.website.site. A constant
the JavaScript adds must be tied here too (the test lists every one it does not know).

The parity tolerances (contract.COSINE_MIN, FP32_ABS_TOL) are here too: `vit.check()` judges
golden references by them, and toleranceClass maps precisions as contract.tolerance_class.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vit_deploy.website import site as web
from vit_deploy.outputs import is_grid_output
from vit_deploy.runtime import config, contract, cpu, preprocess, sizes

SRC = Path(__file__).resolve().parents[2] / "web" / "src"
ENTRIES = ("vit-deploy.mjs", "node.mjs", "browser.mjs")
GRID_NAMES = ["patch_tokens", "layer_1", "layer_12", "layer_03", "layer_", "layer_x",
              "layer_1a", "Layer_1", "logits", "pooled", "class_token", "register_tokens"]

# Each JavaScript constant and the Python value it must equal.
PYTHON = {
    "BUNDLE_FORMAT": contract.BUNDLE_FORMAT,
    "BUNDLE_FORMAT_VERSION": contract.BUNDLE_FORMAT_VERSION,
    "RESIZE_RULES": list(contract.RESIZE_RULES),
    "MIN_CROP_PCT": contract.MIN_CROP_PCT,
    "INTERPOLATIONS": list(contract.INTERPOLATIONS),
    "LOGITS": contract.LOGITS_NAME,
    "PATCH_TOKENS": contract.PATCH_TOKENS_NAME,
    "MAX_PIXELS": preprocess.MAX_PIXELS,
    "MAX_SIDE": sizes.MAX_SIDE,
    "MAX_ABS_MEAN": config.MAX_ABS_MEAN,
    "MIN_STD": config.MIN_STD,
    "MAX_STD": config.MAX_STD,
    "MIN_SCALE": config.MIN_SCALE,
    "MAX_SCALE": config.MAX_SCALE,
    "X86_INT8_EXACT": list(cpu.X86_INT8_EXACT),
    "INT8_CPUS": list(cpu.INT8_CPUS),
    "WEB_RECORD": web.WEB_RECORD,
    "FP32_ABS_TOL": contract.FP32_ABS_TOL,
    "COSINE_MIN": dict(contract.COSINE_MIN),
}
TOLERANCE_PRECISIONS = ["fp32", "fp16", "int8", "int8-static", "int4"]

# Imports each entry; prints { entry: { constants, grid, preprocess } }.
SCRIPT = """
const [src, entries, names, precisions] = JSON.parse(process.argv.at(-1));
const out = {};
for (const entry of entries) {
  const m = await import(new URL(entry, src).href);
  const pre = new m.Preprocess({ resolution: 224, patchSize: 16, mean: [0.5, 0.5, 0.5],
    std: [0.5, 0.5, 0.5] });
  out[entry] = {
    constants: Object.fromEntries(Object.entries(m).filter(([k]) => /^[A-Z][A-Z0-9_]*$/.test(k))),
    grid: names.map((n) => m.isGridOutput(n)),
    tolerance: precisions.map((p) => m.toleranceClass(p)),
    preprocess: { resize: pre.resize, interpolation: pre.interpolation, scale: pre.scale,
      crop_pct: pre.cropPct },
  };
}
process.stdout.write(JSON.stringify(out));
"""


@pytest.fixture(scope="module")
def js() -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the web tests need Node.js (make setup)")
    arg = json.dumps([SRC.as_uri() + "/", list(ENTRIES), GRID_NAMES, TOLERANCE_PRECISIONS])
    r = subprocess.run([node, "--input-type=module", "-e", SCRIPT, arg], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_every_entry_exports_the_same_constants(js):
    first = js[ENTRIES[0]]
    for entry in ENTRIES[1:]:
        assert js[entry] == first, f"{entry} differs from {ENTRIES[0]}"


def test_the_javascript_constants_are_pythons(js):
    constants = js[ENTRIES[0]]["constants"]
    assert sorted(constants) == sorted(PYTHON), (
        f"untied JavaScript constants: {sorted(set(constants) - set(PYTHON))}; "
        f"missing: {sorted(set(PYTHON) - set(constants))}")
    for name, value in PYTHON.items():
        assert constants[name] == value, f"{name}: JavaScript {constants[name]!r}, Python {value!r}"


def test_grid_outputs_are_pythons(js):
    got = dict(zip(GRID_NAMES, js[ENTRIES[0]]["grid"], strict=True))
    assert got == {name: is_grid_output(name) for name in GRID_NAMES}


def test_tolerance_classes_are_pythons(js):
    got = dict(zip(TOLERANCE_PRECISIONS, js[ENTRIES[0]]["tolerance"], strict=True))
    assert got == {p: contract.tolerance_class(p) for p in TOLERANCE_PRECISIONS}


def test_preprocess_defaults_are_pythons(js):
    fields = {f.name: f.default for f in dataclasses.fields(preprocess.Preprocess)}
    got = js[ENTRIES[0]]["preprocess"]
    assert got == {name: fields[name] for name in ("resize", "interpolation", "scale", "crop_pct")}
