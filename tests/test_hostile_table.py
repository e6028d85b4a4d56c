"""The two runtimes refuse the same things: tests/data/hostile-runtime.json's hostile
manifests and options, run here through Python's load_manifest / ViTSession / RuntimeOptions
/ predict (and by web/test/hostile-table.test.mjs through JavaScript's readManifest /
ViT.load / classify), each error matched against the one expression both must meet. And
the bounds behind them are one number each side: MAX_THREADS, MEMORY_FRACTION, the
metadata key, and the attention-memory estimate (JavaScript's attentionBytes / guardMemory
against sizes.attention_bytes / guard_memory)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from vit_deploy.cli import options as cli_options
from vit_deploy.runtime import RuntimeOptions, ViTSession, load_manifest, sizes
from vit_deploy.runtime.config import variant
from vit_deploy.runtime.contract import MANIFEST_NAME, METADATA_CONFIG_KEY
from vit_deploy.runtime.ort_session import MAX_THREADS

ROOT = Path(__file__).resolve().parent.parent
TABLE = json.loads((ROOT / "tests" / "data" / "hostile-runtime.json").read_text())["cases"]
IMAGE = ROOT / "tests" / "data" / "web" / "hopper-small.png"
COMMON = (ROOT / "web" / "src" / "lib" / "common.mjs").as_uri()
MANIFEST_JS = (ROOT / "web" / "src" / "lib" / "manifest.mjs").as_uri()


def _value(v: Any) -> Any:
    """The table's JSON with {"$": "NaN"} as the number it names."""
    if isinstance(v, dict) and set(v) == {"$"}:
        return float(v["$"])
    return v


def _mutate(bundle: Path, changes: dict[str, Any]) -> None:
    m = json.loads((bundle / MANIFEST_NAME).read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        node = m
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(key, None)
        else:
            node[key] = _value(value)
    (bundle / MANIFEST_NAME).write_text(json.dumps(m))


def _error(fn) -> Exception | None:
    try:
        fn()
    except Exception as e:  # the table says which message, not which class
        return e
    return None


def _expect(case: dict, error: Exception | None, what: str) -> None:
    if case["error"] is None:
        assert error is None, f"{case['name']}: {what} refused it: {error!r}"
        return
    assert error is not None, f"{case['name']}: {what} accepted it"
    assert re.search(case["error"], str(error), re.IGNORECASE), (
        f"{case['name']}: {what} said {str(error)!r}; the table expects /{case['error']}/")


def _params() -> list:
    out = []
    for case in TABLE:
        marks = [pytest.mark.xfail(strict=True, reason=case["python_gap"])] \
            if case.get("python_gap") else []
        out.append(pytest.param(case, id=case["name"], marks=marks))
    return out


@pytest.mark.parametrize("case", _params())
def test_python_refuses_what_the_table_says(case, tiny_bundle, tmp_path):
    _, result = tiny_bundle
    bundle = tmp_path / "bundle"
    shutil.copytree(result.path, bundle)
    _mutate(bundle, case.get("manifest", {}))
    stage = case["stage"]
    if stage == "manifest":
        read = _error(lambda: load_manifest(bundle))
        if read is not None:  # refused as it is read: the message the table says
            _expect(case, read, "load_manifest")
        _expect(case, _error(lambda: ViTSession(bundle).close()), "ViTSession")
    elif stage == "load":
        def load() -> None:
            threads = _value(case.get("threads"))
            ViTSession(bundle, precision=case.get("precision", "fp32"),
                       options=RuntimeOptions(threads=threads)).close()
        _expect(case, _error(load), "ViTSession / RuntimeOptions")
    else:
        assert stage == "classify", stage
        with ViTSession(bundle, options=RuntimeOptions(threads=1)) as s:
            if case.get("released"):
                s.close()
            error = _error(lambda: s.predict(IMAGE, top_k=_value(case["topK"])))
        _expect(case, error, "predict")


def test_the_table_covers_what_both_must_refuse():
    names = {c["name"] for c in TABLE}
    assert len(names) == len(TABLE), "case names are unique (they are the tests' ids)"
    threads = {json.dumps(c.get("threads")) for c in TABLE if c["stage"] == "load"}
    assert {"0", "-1", "1.5", "true", "100000"} <= threads
    top = {json.dumps(c.get("topK")) for c in TABLE if c["stage"] == "classify"}
    assert {"-1", "0", '{"$": "NaN"}'} <= top
    changed = {k for c in TABLE for k in c.get("manifest", {})}
    assert {"io.patch_size", "preprocess.resolution", "preprocess.mean",
            "preprocess.std"} <= changed
    assert any("precision" in c for c in TABLE)


# -- the numbers behind the refusals: one each side -------------------------------------------
CONFIGS = [variant("B/16"), variant("S/16"), variant("tiny"), variant("L/14"),
           variant("B/16", dist_token=True), variant("S/14", num_registers=4),
           variant("tiny", class_token=False, pool="mean")]
SIZES = [(224, 224), (448, 320), (1024, 1024), (8192, 8192)]

SCRIPT = """
const [common, manifestJs, configs, sizes, gib, manifests] = JSON.parse(process.argv.at(-1));
const c = await import(common);
const { readManifest } = await import(manifestJs);
const out = { MAX_THREADS: c.MAX_THREADS, MEMORY_FRACTION: c.MEMORY_FRACTION,
  METADATA_CONFIG_KEY: c.METADATA_CONFIG_KEY, bytes: [], refusals: [], read: [] };
for (const config of configs) {
  for (const [h, w] of sizes) {
    out.bytes.push(c.attentionBytes(h, w, config, 3));
    try {
      c.guardMemory(h, w, config, { batch: 2, available: gib * 2 ** 30 });
      out.refusals.push(null);
    } catch (e) { out.refusals.push(e.message); }
  }
}
for (const m of manifests) out.read.push(readManifest(m).config);
process.stdout.write(JSON.stringify(out));
"""


def _js(configs: list[dict], gib: float, manifests: list[dict]) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the web tests need Node.js (make setup)")
    arg = json.dumps([COMMON, MANIFEST_JS, configs, SIZES, gib, manifests])
    r = subprocess.run([node, "--input-type=module", "-e", SCRIPT, arg], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_the_bounds_and_the_memory_estimate_are_one_each_side(tiny_bundle, monkeypatch):
    _, result = tiny_bundle
    base = json.loads((result.path / MANIFEST_NAME).read_text())
    manifests = []
    for cfg in CONFIGS:  # the manifest's config as each runtime reads it for the estimate
        m = json.loads(json.dumps(base))
        m["config"] = cfg.to_dict()
        m["io"]["patch_size"] = cfg.patch_size
        m["preprocess"]["resolution"] = [cfg.patch_size * 4] * 2
        m.pop("references", None)
        manifests.append(m)
    gib = 64.0  # a machine with 64 GiB available
    js = _js([{"patchSize": c.patch_size, "heads": c.heads, "width": c.width,
               "prefixTokens": c.num_prefix_tokens} for c in CONFIGS], gib, manifests)

    assert js["MAX_THREADS"] == MAX_THREADS
    assert cli_options.MAX_THREADS == MAX_THREADS  # the CLI's --threads bound: the runtime's
    assert js["MEMORY_FRACTION"] == sizes.MEMORY_FRACTION
    assert js["METADATA_CONFIG_KEY"] == METADATA_CONFIG_KEY
    assert js["read"] == [{"patchSize": c.patch_size, "inChans": c.in_chans, "heads": c.heads,
                           "width": c.width, "prefixTokens": c.num_prefix_tokens}
                          for c in CONFIGS]

    monkeypatch.setattr(sizes, "available_memory", lambda: int(gib * 2**30))
    bytes_, refusals = iter(js["bytes"]), iter(js["refusals"])
    for cfg in CONFIGS:
        for h, w in SIZES:
            py = sizes.attention_bytes(h, w, cfg, batch=3)
            got = next(bytes_)
            assert got == py or math.isclose(got, py, rel_tol=1e-15), (cfg.name, h, w, got, py)
            try:
                sizes.guard_memory(h, w, cfg, batch=2)
                python = None
            except sizes.MemoryEstimateError as e:
                python = str(e)
            javascript = next(refusals)
            assert (python is None) == (javascript is None), (cfg.name, h, w, python, javascript)
            if python is not None:  # the same numbers, up to how each says to override
                assert python.split("; use")[0] == javascript.split("; use")[0]
