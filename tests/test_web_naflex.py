"""`vit-deploy web` on a SigLIP 2 NaFlex bundle: the site, and its page's code path.

One tiny random SigLIP 2 tower (tests/siglip2_tiny.py) exported with `export --naflex` (a
budget of 64 patches) and quantised to int8; `vit-deploy web --precision fp32,int8` writes
the site. In Node, what the page does (NaFlex.load on the site's bundle/ with a precision,
then features of one picked image) against Python's NaFlexSession on the bundle: the same
grids and pooled vectors within 1e-5 relative, two images of different aspect ratios, both
precisions. In headless Chromium (as tests/test_web.py), the page itself, served by
`vit-deploy web --serve`, given each image through its file input.
"""

from __future__ import annotations

import json
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
      checkHidden: await page.evaluate(() => document.getElementById('check').hidden), images: {} };
    for (const [i, image] of job.images.entries()) {
      await page.setInputFiles('#file', image);
      await page.waitForFunction((n) => Number(document.body.dataset.classified ?? 0) === n, i + 1, { timeout: 60_000 });
      out[precision].images[image] = await page.evaluate(() => ({ ...window.naflexResult,
        shown: document.getElementById('top').textContent, timing: document.getElementById('timing').textContent }));
    }
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


def _python(bundle: Path, images: list[Path]) -> dict:
    from vit_deploy.runtime.naflex_session import NaFlexSession

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
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "driver.mjs").write_text(DRIVER)
    r = subprocess.run([_node(), str(tmp_path / "driver.mjs"), (WEB / "src" / "node.mjs").as_uri(),
                        str(tmp_path / "job.json")], cwd=WEB, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
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


def test_the_page_in_headless_chromium(bundle, images, tmp_path):
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
        assert page["checkHidden"] and "NaFlex" in page["model"] and "64 patches" in page["model"]
        assert f"{precision} · session" in page["status"] and "onnxruntime-web" in page["status"]
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
