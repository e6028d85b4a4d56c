"""`vit-deploy web` on a SigLIP 2 NaFlex bundle: the site, and its page's code path.

One tiny random SigLIP 2 tower (tests/siglip2_tiny.py) exported with `export --naflex` (a
budget of 64 patches) and quantised to int8; `vit-deploy web --precision fp32,int8` writes
the site. In Node, what the page does (NaFlex.load on the site's bundle/ with a precision,
then features of one picked image) against Python's NaFlexSession on the bundle: the same
grids and pooled vectors within 1e-5 relative, two images of different aspect ratios, both
precisions. `naflex.check()` in Node against Python's `vit-deploy check --reference bundle
--json` on the same bundle: every case and output passes, with Python's figures (max |Δ|,
tolerance, cosine, resolution, batch); a changed references.bin and a manifest without
naflex_references are refused. In headless Chromium (as tests/website/test_web.py), the page itself,
served by `vit-deploy web --serve`, given each image through its file input, then its
"check and measure" (naflex.check() on WebAssembly).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from web_node import node as _node
from click.testing import CliRunner
from PIL import Image

from siglip2_tiny import tiny_siglip2
from vit_deploy.cli import main
from vit_deploy.runtime import RuntimeOptions, load_manifest

pytestmark = pytest.mark.heavy  # an export, a quantisation, Node and Chromium (~1 min)

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
CHROMIUM = "/usr/bin/chromium"
BUDGET = 64
SIZES = {"wide.png": (40, 160), "tall.png": (150, 60)}  # (height, width): 1:4 and 5:2
RTOL = 1e-5  # max abs difference / max abs of Python's pooled vector

# What the page does (web/src/index.html's loadNaflex and embed), in Node.
DRIVER = r"""
import fs from 'node:fs';
const web = await import(process.argv[2]);
const job = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const out = {};
for (const precision of job.precisions) {
  const naflex = await web.NaFlex.load(job.bundle, { precision });
  out[precision] = { maxNumPatches: naflex.preprocess.maxNumPatches, patchSize: naflex.preprocess.patchSize,
    mean: naflex.preprocess.mean, url: naflex.url, images: {} };
  for (const image of job.images) {
    const r = await naflex.features(image);
    out[precision].images[image] = { grid: r.grids[0], pooled: Array.from(r.pooled.data) };
  }
  await naflex.release();
}
console.log(JSON.stringify(out));
"""

# naflex.check() in Node: both precisions (fp32 also loaded with another patch budget: the
# check preprocesses by the bundle's rule), then the bundles that must be refused.
CHECK = r"""
import fs from 'node:fs';
const web = await import(process.argv[2]);
const job = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const out = { reports: {}, refused: {} };
for (const [name, precision, options] of [['fp32', 'fp32', {}], ['int8', 'int8', {}],
  ['fp32 at 256 patches', 'fp32', { maxNumPatches: 256 }]]) {
  const naflex = await web.NaFlex.load(job.bundle, { precision, threads: 1, ...options });
  const t0 = performance.now();
  out.reports[name] = { ...await naflex.check({ latencyRuns: 3 }), ms: performance.now() - t0,
    splitBatches: naflex.info.splitBatches };
  await naflex.release();
}
out.broken = await web.NaFlex.load(job.broken).then(() => null, (e) => `${e.name}: ${e.message}`);
for (const [name, where] of Object.entries(job.refused)) {
  const naflex = await web.NaFlex.load(where, { threads: 1 });
  out.refused[name] = await naflex.check().then(() => null, (e) => `${e.name}: ${e.message}`);
  await naflex.release();
}
console.log(JSON.stringify(out));
"""

# The page in Chromium: each image through the file input, what the page shows and computed.
BROWSER = r"""
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
const job = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const { chromium } = createRequire(job.web + '/package.json')('playwright-core');
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-naflex-'));
const context = await chromium.launchPersistentContext(profile, { executablePath: job.chromium,
  headless: true, args: ['--no-sandbox', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-gpu'] });
try {
  const out = {};
  for (const precision of job.precisions) {
    const page = await context.newPage();
    page.on('pageerror', (e) => process.stderr.write(`[page error] ${e.message}\n`));
    await page.goto(`${job.url}?precision=${precision}`);
    await page.waitForFunction(() => document.body.dataset.ready, null, { timeout: 90_000 });
    const status = await page.textContent('#status');
    if (await page.evaluate(() => document.body.dataset.ready) !== 'true') throw new Error(status);
    out[precision] = { status, model: await page.textContent('#model'),
      selected: await page.evaluate(() => document.getElementById('precision').value),
      checkHidden: await page.evaluate(() => document.getElementById('check').hidden), images: {} };
    for (const [i, image] of job.images.entries()) {
      await page.setInputFiles('#file', image);
      await page.waitForFunction((n) => Number(document.body.dataset.classified ?? 0) === n, i + 1, { timeout: 60_000 });
      out[precision].images[image] = await page.evaluate(() => ({ ...window.naflexResult,
        shown: document.getElementById('top').textContent, timing: document.getElementById('timing').textContent }));
    }
    out[precision].checkBefore = await page.evaluate(() => ({ disabled: document.getElementById('check-run').disabled,
      status: document.getElementById('check-status').textContent }));
    await page.click('#check-run'); // "check and measure": naflex.check() on each backend offered
    await page.waitForFunction(() => document.body.dataset.checked, null, { timeout: 120_000 });
    out[precision].check = await page.evaluate(() => ({ state: document.body.dataset.checked,
      status: document.getElementById('check-status').textContent, report: window.checkReport ?? null,
      offered: window.checkOffered ?? null, rows: document.getElementById('check-cases').rows.length }));
    await page.close();
  }
  console.log(JSON.stringify(out));
} finally {
  await context.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    checkpoint = tiny_siglip2(tmp_path_factory.mktemp("hf") / "siglip2")[1]
    out = tmp_path_factory.mktemp("naflex") / "b"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = CliRunner().invoke(main, ["export", "--checkpoint", str(checkpoint), "--naflex",
                                      "--max-patches", str(BUDGET), "--out", str(out), "--quiet"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(main, ["quantize", str(out), "--precision", "int8"])
        assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("naflex-images")
    rng = np.random.default_rng(0)
    paths = []
    for name, (h, w) in SIZES.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(d / name)
        paths.append(d / name)
    return paths


@pytest.fixture(scope="module")
def site(bundle, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    r = CliRunner().invoke(main, ["web", str(bundle), "--out", str(out),
                                  "--precision", "fp32,int8"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def python_check(bundle, tmp_path_factory) -> dict:
    """Python's `vit-deploy check BUNDLE --reference bundle --json` (every precision, CPU)."""
    out = tmp_path_factory.mktemp("check") / "check.json"
    r = CliRunner().invoke(main, ["check", str(bundle), "--reference", "bundle", "--json",
                                  str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def _in_node(script: str, job: dict, tmp_path: Path) -> dict:
    """Run `script` in Node with the package's node.mjs and `job` (as JSON); what it printed
    last, parsed."""
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "script.mjs").write_text(script)
    r = subprocess.run([_node(), str(tmp_path / "script.mjs"), (WEB / "src" / "node.mjs").as_uri(),
                        str(tmp_path / "job.json")], cwd=WEB, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _python(bundle: Path, images: list[Path]) -> dict:
    from vit_deploy.runtime.naflex.session import NaFlexSession

    out = {}
    for precision in ("fp32", "int8"):
        session = NaFlexSession(bundle, precision=precision)
        out[precision] = {p.name: session.features([p]) for p in images}
    return out


def test_web_writes_a_naflex_site(bundle, site):
    from vit_deploy.runtime.manifest import load_manifest

    record = json.loads((site / "bundle" / "web.json").read_text())
    assert record["naflex"] is True and record["precisions"] == ["fp32", "int8"]
    m = load_manifest(bundle)
    for name in ("manifest.json", m.model_file("fp32"), m.model_file("int8")):
        assert (site / "bundle" / name).read_bytes() == (bundle / name).read_bytes(), name
    assert (site / "index.html").is_file() and (site / "lib" / "naflex.mjs").is_file()
    assert (site / "browser.mjs").is_file() and (site / "ort").is_dir()
    files = json.loads((site / "manifest.json").read_text())
    assert "lib/naflex.mjs" in json.dumps(files)
    # a re-run replaces the site (atomically, as for every bundle); a foreign folder is kept
    r = CliRunner().invoke(main, ["web", str(bundle), "--out", str(site), "--force"])
    assert r.exit_code == 0, r.output
    assert json.loads((site / "bundle" / "web.json").read_text())["precisions"] == ["fp32"]
    r = CliRunner().invoke(main, ["web", str(bundle), "--out", str(site), "--precision",
                                  "fp32,int8", "--force"])
    assert r.exit_code == 0, r.output


def test_the_pages_code_path_in_node_matches_python(bundle, site, images, tmp_path):
    job = {"bundle": str(site / "bundle"), "images": [str(p) for p in images],
           "precisions": ["fp32", "int8"]}
    got = _in_node(DRIVER, job, tmp_path)
    want = _python(bundle, images)
    worst = {}
    for precision in ("fp32", "int8"):
        g = got[precision]
        assert g["maxNumPatches"] == BUDGET and g["patchSize"] == 16 and g["mean"] == [0.5] * 3
        assert g["url"].endswith("/bundle/" + ("model.onnx" if precision == "fp32" else
                                                "model.int8.onnx")), g["url"]
        grids = set()
        for p in images:
            w = want[precision][p.name]
            page = g["images"][str(p)]
            assert page["grid"] == list(w.tokens[0].shape[:2]), (page["grid"], w.tokens[0].shape)
            grids.add(tuple(page["grid"]))
            pooled = np.asarray(page["pooled"], np.float32)
            ref = np.asarray(w.pooled[0], np.float32)
            assert pooled.shape == ref.shape == (64,)
            worst[f"{precision} {p.name} {page['grid']}"] = float(
                np.abs(pooled - ref).max() / np.abs(ref).max())
        assert len(grids) == 2 and all(gh * gw <= BUDGET for gh, gw in grids), grids
    print("the page's code path in Node vs NaFlexSession (max abs / max abs):",
          {k: f"{v:.1e}" for k, v in worst.items()})
    assert max(worst.values()) <= RTOL, worst


def _assert_page_check(page: dict, precision: str, python_check: dict) -> None:
    """The page's "check and measure" on a NaFlex bundle: naflex.check() on WebAssembly (no
    adapter under --disable-gpu), every case passing the policy, near Python's figures."""
    before, check = page["checkBefore"], page["check"]
    assert not before["disabled"] and before["status"].startswith("3 reference cases (mixed: "
                                                                 "6 images, tall: 1 image"), before
    assert check["state"] == "true", check["status"]
    report = check["report"]
    assert check["offered"]["backends"] == ["wasm"] and report["passed"] is True, report["cases"]
    shown = re.match(r"passed: 6 of 6 cases within the tolerance policy, worst cosine ([0-9.]+) · "
                     r"golden references \(pytorch fp32, torch ", check["status"])
    assert shown and abs(float(shown[1]) - min(c["cosine"] for c in report["cases"])) <= 1e-7, \
        check["status"]
    assert report["device"]["runtime"].startswith("onnxruntime-web ") and check["rows"] == 7
    python = {(c["case"], c["output"]): c for c in python_check["cases"]
              if c["precision"] == precision}
    assert {(c["case"], c["output"]) for c in report["cases"]} == set(python)
    apart = 0.0
    for c in report["cases"]:
        want = python[(c["case"], c["output"])]
        assert c["provider"] == "wasm" and c["precision"] == precision and c["passed"]
        assert (c["resolution"], c["batch"], c["cosine_min"]) == (
            want["resolution"], want["batch"], want["cosine_min"])
        # onnxruntime-web's WebAssembly kernels are not the CPU provider's: close, not equal
        apart = max(apart, abs(c["cosine"] - want["cosine"]))
    assert apart <= 1e-4, apart
    [lat] = report["latency"]
    assert lat["provider"] == "wasm" and lat["runs"] == 10 and lat["p50_ms"] > 0
    print(f"Chromium check {precision}: {check['status'][:75]}; worst max|Δ| "
          f"{max(c['max_abs'] for c in report['cases']):.2e}; cosines within {apart:.1e} of "
          f"Python's; first case p50 {lat['p50_ms']:.1f} ms")


def test_the_page_in_headless_chromium(bundle, images, python_check, tmp_path):
    import re
    import sys

    node = _node()
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's chromium package")
    proc = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "web", str(bundle), "--out",
                             str(tmp_path / "site"), "--precision", "fp32,int8", "--serve",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = next((m.group(1) for line in proc.stdout
                    if (m := re.search(r"on (http://\S+/)", line))), None)
        assert url, proc.stderr.read()[-2000:]
        job = {"chromium": CHROMIUM, "web": str(WEB), "url": url,
               "images": [str(p) for p in images], "precisions": ["fp32", "int8"]}
        (tmp_path / "job.json").write_text(json.dumps(job))
        (tmp_path / "browser.mjs").write_text(BROWSER)
        r = subprocess.run([node, str(tmp_path / "browser.mjs"), str(tmp_path / "job.json")],
                           cwd=WEB, capture_output=True, text=True, timeout=240)
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    want = _python(bundle, images)
    for precision in ("fp32", "int8"):
        page = got[precision]
        assert not page["checkHidden"] and "NaFlex" in page["model"] and "64 patches" in page["model"]
        assert f"{precision} · session" in page["status"] and "onnxruntime-web" in page["status"]
        assert page["selected"] == precision  # the control shows what runs (it showed fp32)
        for p in images:
            shown = page["images"][str(p)]
            w = want[precision][p.name]
            gh, gw = w.tokens[0].shape[:2]
            assert shown["grid"] == [gh, gw] and f"{gh}×{gw} = {gh * gw} of 64 patches" in shown["shown"]
            ref = np.asarray(w.pooled[0], np.float32)
            pooled = np.asarray(shown["pooled"], np.float32)
            rel = float(np.abs(pooled - ref).max() / np.abs(ref).max())
            cosine = float(pooled @ ref / (np.linalg.norm(pooled) * np.linalg.norm(ref)))
            print(f"Chromium {precision} {p.name} {gh}x{gw}: rel {rel:.1e}, cosine {cosine:.7f}; "
                  f"{shown['timing']}")
            # onnxruntime-web's WebAssembly kernels are not the CPU provider's: close, not equal
            assert cosine >= 0.9999 and rel <= 1e-4, (precision, p.name, rel, cosine)
            norm = float(re.search(rf"{pooled.size} values, norm ([0-9.]+)", shown["shown"])[1])
            assert abs(norm - np.linalg.norm(ref)) <= 1e-3 * np.linalg.norm(ref), norm
        _assert_page_check(page, precision, python_check)


def _refused_bundles(bundle: Path, tmp_path: Path) -> dict[str, str]:
    """Copies of the bundle the check must refuse: references.bin with one byte changed (the
    manifest not updated), a manifest without naflex_references; and one that does not load
    (an output placed past the end of references.bin)."""
    import shutil

    changed, without, broken = tmp_path / "changed", tmp_path / "without", tmp_path / "broken"
    for d in (changed, without, broken):
        shutil.copytree(bundle, d)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["naflex_references"]["cases"][1]["outputs"]["pooled"]["offset"] = 1 << 20
    (broken / "manifest.json").write_text(json.dumps(manifest))
    data = bytearray((changed / "references.bin").read_bytes())
    data[len(data) // 2] ^= 0x01
    (changed / "references.bin").write_bytes(bytes(data))
    manifest = json.loads((without / "manifest.json").read_text())
    del manifest["naflex_references"]
    (without / "manifest.json").write_text(json.dumps(manifest))
    return {"changed": str(changed), "without": str(without), "broken": str(broken)}


def test_check_in_node_agrees_with_python(bundle, python_check, tmp_path):
    """naflex.check() (onnxruntime-node) on the bundle Python checked: the same report kind,
    every case and output passing, Python's figures case by case (max |Δ| and cosine within
    1e-5, tolerance, resolution and batch exactly; int8 runs a batch one image at a time, as
    Python does: dynamic int8 couples a batch's images)."""
    refused = _refused_bundles(bundle, tmp_path)
    job = {"bundle": str(bundle), "broken": refused.pop("broken"), "refused": refused}
    got = _in_node(CHECK, job, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())["naflex_references"]
    python = {(c["case"], c["precision"], c["output"]): c for c in python_check["cases"]}
    assert python_check["passed"] and python_check["kind"] == "check"
    worst = {}
    for name, report in got["reports"].items():
        precision = name.split()[0]
        assert report["schema"] == "vit-deploy-report" and report["schema_version"] == 1
        assert report["kind"] == "check" and report["passed"] is True, report["cases"]
        assert report["bundle"] == str(bundle)
        assert report["device"]["runtime"] == "onnxruntime-node 1.30.0"
        assert report["reference"].startswith("golden references (pytorch fp32, torch ")
        assert report["splitBatches"] is (precision == "int8")
        assert [(c["label"], c["output"]) for c in report["cases"]] == [
            (c["name"], o) for c in manifest["cases"] for o in c["outputs"]]
        diffs = []
        for c in report["cases"]:
            want = python[(c["case"], precision, c["output"])]
            assert c["provider"] == "cpu" and c["precision"] == precision and c["passed"]
            for key in ("resolution", "batch", "abs_tol", "cosine_min", "passed"):
                assert c[key] == want[key], (name, c["label"], key, c[key], want[key])
            diffs += [abs(c["max_abs"] - want["max_abs"]), abs(c["cosine"] - want["cosine"])]
        worst[name] = max(diffs)
        [lat] = report["latency"]
        assert (lat["provider"], lat["precision"], lat["runs"], lat["batch"], lat["resolution"]) \
            == ("cpu", precision, 3, len(manifest["cases"][0]["images"]), [128, 128])
        assert 0 < lat["p50_ms"] <= lat["p90_ms"]
        print(f"naflex.check() {name}: {len(report['cases'])} cases, "
              f"{report['ms']:.0f} ms; worst cosine {min(c['cosine'] for c in report['cases']):.7f}, "
              f"worst max|Δ| {max(c['max_abs'] for c in report['cases']):.2e}; first case "
              f"p50 {lat['p50_ms']:.1f} ms (batch {lat['batch']}); max difference from "
              f"Python's figures {worst[name]:.1e}")
    assert max(worst.values()) <= 1e-5, worst
    refused = got["refused"]
    assert refused["changed"].startswith("BundleError: references ") and re.search(
        r"references\.bin has sha256 [0-9a-f]{16}…, the manifest says [0-9a-f]{16}… \(modified "
        r"after export\)", refused["changed"]), refused["changed"]
    assert refused["without"].startswith("BundleError: ") and 'has no NaFlex golden references ' \
        '(its manifest has no "naflex_references")' in refused["without"], refused["without"]
    assert got["broken"].startswith("BundleError: manifest ") and re.search(
        r"naflex_references\.cases\[1\]\.outputs\[\"pooled\"\] must be \{offset .* inside the "
        r"\d+-byte references\.bin, got", got["broken"]), got["broken"]


# Each refusal of a NaFlex model too large for memory, in Node: `available` bytes stand in for
# the machine's (a subclass's platform), so the verdict does not depend on this machine.
GUARD = r"""
import fs from 'node:fs';
const web = await import(process.argv[2]);
const job = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
class Small extends web.NaFlex {
  static platform = { ...web.NaFlex.platform, availableMemory: async () => job.available };
}
const said = (p) => p.then(() => null, (e) => e.message);
const out = {};
out.budget = await said(Small.load(job.bundle, { maxNumPatches: job.huge }));
out.allowed = await said(Small.load(job.bundle, { maxNumPatches: job.huge, allowLarge: true })
  .then((n) => n.release()));
const naflex = await Small.load(job.bundle, { maxNumPatches: job.fits });
out.one = await said(naflex.features(job.images[0]));
out.batch = await said(naflex.features(job.images));
await naflex.release();
out.references = await said(web.NaFlex.load(job.large_references));
console.log(JSON.stringify(out));
"""


def test_both_runtimes_refuse_a_naflex_model_memory_cannot_hold(bundle, images, tmp_path,
                                                                monkeypatch):
    """NaFlex had no attention-memory guard: a budget of 65,536 patches ran out of memory.
    With 1 GiB available (stood in on both sides), each runtime refuses a budget whose one
    image cannot fit at load, before any image is read (allow_large / allowLarge lets it
    load), runs one image at a budget that fits and refuses a batch of two at it (fp32 runs
    a batch whole); a manifest whose golden reference images would take more than 2**24
    values is refused before any is built (8192x8192 once took 6.3 GB)."""
    from vit_deploy.runtime import sizes
    from vit_deploy.runtime.naflex.session import NaFlexSession

    available, huge, fits = 2**30, 16384, 4096  # 8 GiB of attention; 0.5 GiB: one, not two
    large = tmp_path / "large-references"
    shutil.copytree(bundle, large)
    manifest = json.loads((large / "manifest.json").read_text())
    manifest["naflex_references"]["cases"][0]["images"][0]["size"] = [4096, 4096]
    (large / "manifest.json").write_text(json.dumps(manifest))

    monkeypatch.setattr(sizes, "available_memory", lambda: available)
    budget = rf"max_num_patches {huge} means {huge} tokens: attention needs about 8\.0 GiB, " \
             r"and 1\.0 GiB are available; use a smaller max_num_patches \(or allow_large=True"
    with pytest.raises(sizes.MemoryEstimateError, match=budget):
        NaFlexSession(bundle, max_num_patches=huge)
    NaFlexSession(bundle, max_num_patches=huge, options=RuntimeOptions(allow_large=True)).close()
    with NaFlexSession(bundle, max_num_patches=fits) as s:
        assert s.features(images[:1]).pooled.shape == (1, 64)
        with pytest.raises(sizes.MemoryEstimateError, match=rf"pixel_values \(2, {fits}, 768\) means {fits} "
                                              r"tokens: .* use fewer patches per image"):
            s.features(images)
    with pytest.raises(ValueError, match=r"16777216 pixel values at most"):
        load_manifest(large)

    job = {"bundle": str(bundle), "available": available, "huge": huge, "fits": fits,
           "images": [str(p) for p in images], "large_references": str(large)}
    got = _in_node(GUARD, job, tmp_path)
    assert re.search(budget.replace("max_num_patches", "maxNumPatches")
                     .replace(r"allow_large=True", r"allowLarge: true"), got["budget"]), got
    assert got["allowed"] is None and got["one"] is None, got
    assert re.search(rf"pixel_values \[2,{fits},768\] means {fits} tokens: .* use fewer patches "
                     r"per image", got["batch"] or ""), got
    assert "16777216 pixel values at most" in (got["references"] or ""), got
