"""The JavaScript runtime as the npm package `vit-deploy`, tried as an app uses it: `npm pack`
makes a tarball, a fresh project installs it (offline, from npm's cache), imports it by
name in Node and classifies as Python does, type-checks the TypeScript examples against
its declarations, and serves the package's own files to headless Chromium.

The install is `npm ci --offline` with a lockfile written here: the tarball, plus every
package web/package-lock.json pins for production. `make setup` (npm ci in web/) leaves
exactly those in npm's cache; a lockfile-free `npm install --offline` would need npm's
cached registry metadata too, which npm ci does not fetch (and the test must not reach the
network).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
IMAGES = ROOT / "tests" / "data" / "web"
CHROMIUM = "/usr/bin/chromium"
LABELS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
PNGS = ("hopper-wide.png", "hopper-small.png", "present-alpha.png")
# the app's script: the package by name, where Node found it, and what it computed
CLASSIFY = """
import { ViT } from 'vit-deploy';
const [bundle, ...images] = process.argv.slice(2);
const vit = await ViT.load(bundle, { threads: 1 });
const results = {};
for (const image of images) {
  const r = await vit.classify(image, { topK: 3 });
  results[image] = { top: r.top, logits: Array.from(r.logits) };
}
await vit.release();
console.log(JSON.stringify({ resolved: import.meta.resolve('vit-deploy'), info: vit.info, results }));
"""


def _run(cmd: list[str], cwd: Path, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                       timeout=timeout, check=False)
    assert r.returncode == 0, f"{' '.join(cmd)} in {cwd}:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def _package() -> dict:
    return json.loads((WEB / "package.json").read_text())


def test_package_version_follows_the_python_package():
    project = (ROOT / "pyproject.toml").read_text().split("[project]", 1)[1]
    python = re.search(r'^version = "([^"]+)"', project, re.MULTILINE).group(1)
    package = _package()
    assert package["version"] == python, "web/package.json's version must be pyproject.toml's"
    assert package["name"] == "vit-deploy" and "private" not in package


# -- the tarball, installed into a fresh project -----------------------------------------
@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, dict]:
    """A tiny labelled bundle and Python's logits and top-3 for each PNG (PNG decodes
    bit-identically in Node; JPEG through jpeg-js does not, see docs/browser-and-node.md)."""
    from vit_deploy.export.bundle import ExportOptions, export_bundle
    from vit_deploy.export.model import build_model
    from vit_deploy.runtime import ViTSession
    from vit_deploy.runtime.config import variant
    from vit_deploy.runtime.preprocess import load_image

    out = tmp_path_factory.mktemp("npm") / "bundle"
    export_bundle(build_model(variant("tiny"), seed=0), out,
                  options=ExportOptions(resolution=(48, 64), simplify=False, labels=LABELS))
    want = {}
    with ViTSession(out) as session:
        for name in PNGS:
            x = session.preprocess().array(load_image(IMAGES / name))[None]
            top = session.predict([IMAGES / name], top_k=3)[0].top
            want[name] = {"logits": session.run(x)[0], "top": [c.index for c in top]}
    return out, want


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    """A fresh project with the packed tarball installed: node_modules/vit-deploy."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not on PATH: the package test needs Node.js and npm (make setup)")
    app = tmp_path_factory.mktemp("app")
    r = _run([npm, "pack", "--json", "--pack-destination", str(app)], WEB, timeout=120)
    packed = json.loads(r.stdout)[0]
    tarball = app / packed["filename"]
    files = {f["path"] for f in packed["files"]}
    assert {"package.json", "README.md", "src/node.mjs", "src/browser.mjs", "src/index.html",
            "types/node.d.ts", "types/common.d.ts"} <= files, sorted(files)
    assert not any(f.startswith(("test/", "testing/", "node_modules/")) for f in files), files
    package, lock = _package(), json.loads((WEB / "package-lock.json").read_text())
    spec = f"file:{tarball.name}"
    digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    packages = {"": {"name": "app", "dependencies": {"vit-deploy": spec}},
                "node_modules/vit-deploy": {
                    "version": package["version"], "resolved": spec,
                    "integrity": f"sha512-{digest}", "license": package["license"],
                    "dependencies": package["dependencies"], "engines": package["engines"]}}
    packages.update({path: entry for path, entry in lock["packages"].items()
                     if path.startswith("node_modules/") and not entry.get("dev")})
    (app / "package.json").write_text(json.dumps(
        {"name": "app", "private": True, "type": "module", "dependencies": {"vit-deploy": spec}}))
    (app / "package-lock.json").write_text(json.dumps(
        {"name": "app", "lockfileVersion": 3, "requires": True, "packages": packages}))
    _run([npm, "ci", "--offline", "--no-audit", "--no-fund", "--loglevel=error"], app,
         timeout=600, ONNXRUNTIME_NODE_INSTALL="skip")  # skip the CUDA download: no network
    installed = json.loads((app / "node_modules" / "vit-deploy" / "package.json").read_text())
    assert installed["version"] == package["version"]
    return app


def test_tarball_installs_imports_by_name_and_classifies_as_python(app, bundle):
    path, want = bundle
    (app / "classify.mjs").write_text(CLASSIFY)
    r = _run(["node", "classify.mjs", str(path), *(str(IMAGES / n) for n in PNGS)], app)
    out = json.loads(r.stdout)
    assert out["resolved"] == (app / "node_modules" / "vit-deploy" / "src" / "node.mjs").as_uri()
    assert out["info"]["backend"] == "onnxruntime-node" and out["info"]["provider"] == "cpu"
    for name in PNGS:
        got = out["results"][str(IMAGES / name)]
        delta = float(np.abs(np.asarray(got["logits"], np.float32) - want[name]["logits"]).max())
        assert delta <= 1e-5, f"{name}: max |Δ| {delta} from Python's logits"
        assert [c["index"] for c in got["top"]] == want[name]["top"], name
        assert got["top"][0]["label"] == LABELS[want[name]["top"][0]]
    # the shipped Node example, copied into the app as a user would
    shutil.copy(ROOT / "examples" / "classify_node.mjs", app / "classify_node.mjs")
    r = _run(["node", "classify_node.mjs", str(path), str(IMAGES / PNGS[0]), "--top-k", "2"], app)
    assert LABELS[want[PNGS[0]]["top"][0]] in r.stdout.splitlines()[1], r.stdout


def _tsc() -> Path:
    """web/node_modules/.bin/tsc (TypeScript, pinned in web/package.json's devDependencies,
    installed by make setup), or VIT_DEPLOY_TSC."""
    tsc = Path(os.environ.get("VIT_DEPLOY_TSC") or WEB / "node_modules" / ".bin" / "tsc")
    if not tsc.is_file():
        pytest.fail(f"{tsc} is missing: TypeScript is a devDependency of web/ (make setup: npm "
                    f"ci in web/), or set VIT_DEPLOY_TSC")
    return tsc


def test_typescript_examples_check_against_the_shipped_declarations(app):
    """tsc --noEmit on examples/typescript/ inside the app: the Node example through the
    "node" condition, the page through "browser" and through a bundler that picks neither;
    and a misuse of the API is an error (the declarations are not `any`)."""
    tsc = _tsc()
    version = _run([str(tsc), "--version"], app).stdout.split()[-1]
    assert version == _package()["devDependencies"]["typescript"], version
    for f in (ROOT / "examples" / "typescript").iterdir():
        shutil.copy(f, app / f.name)
    (app / "tsconfig.bundler.json").write_text(json.dumps(
        {"extends": "./tsconfig.browser.json", "compilerOptions": {"customConditions": []}}))
    for config, declarations in (("tsconfig.json", "node.d.ts"),
                                 ("tsconfig.browser.json", "browser.d.ts"),
                                 ("tsconfig.bundler.json", "vit-deploy.d.ts")):
        r = _run([str(tsc), "-p", config, "--explainFiles"], app, timeout=120)
        assert f"node_modules/vit-deploy/types/{declarations}" in r.stdout, (config, r.stdout[-2000:])
    (app / "wrong.ts").write_text("import { ViT } from 'vit-deploy';\n"
                                  "const vit = await ViT.load('b', { backend: 'gpu' });\n"
                                  "await vit.classify(42);\n"
                                  "const r = await vit.classify('a.png', { topK: '3' });\n"
                                  "console.log(r.top[0].probabilty);\n")
    (app / "tsconfig.wrong.json").write_text(json.dumps(
        {"extends": "./tsconfig.json", "files": ["wrong.ts"]}))
    r = subprocess.run([str(tsc), "-p", "tsconfig.wrong.json"], cwd=app, capture_output=True,
                       text=True, timeout=120, check=False)
    errors = set(re.findall(r"error (TS\d+)", r.stdout))
    assert r.returncode != 0 and len(re.findall(r"wrong\.ts\(", r.stdout)) == 4, r.stdout
    assert errors <= {"TS2322", "TS2345", "TS2551"}, r.stdout


def test_package_files_in_headless_chromium(app, bundle, tmp_path, monkeypatch):
    """`vit-deploy web` with VIT_DEPLOY_WEB_DIR at the installed package: the site carries
    the package's own files (its onnxruntime-web found beside it, as npm installed it), and
    its page, which imports 'vit-deploy' through an import map, classifies as Python."""
    from vit_deploy.website.site import ORT_DIR, WebSources, make_server, write_site

    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's chromium package "
                    f"(make setup installs it where apt-get is usable)")
    path, want = bundle
    package = app / "node_modules" / "vit-deploy"
    monkeypatch.setenv("VIT_DEPLOY_WEB_DIR", str(package))
    sources = WebSources.find()
    assert sources.ort_dist == app / "node_modules" / "onnxruntime-web" / "dist"
    site = tmp_path / "site"
    write_site(path, site, threads=2, sources=sources)
    for name in sources.modules:
        assert (site / name).read_bytes() == (package / "src" / name).read_bytes(), name
    page = (site / "index.html").read_text()  # the package by name, through an import map
    assert '"vit-deploy": "./browser.mjs"' in page and " from 'vit-deploy';" in page
    assert (site / ORT_DIR / "ort.wasm.min.mjs").read_bytes() == \
        (sources.ort_dist / "ort.wasm.min.mjs").read_bytes()
    server = make_server(site, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        job = {"chromium": CHROMIUM,
               "images": {n: base64.b64encode((IMAGES / n).read_bytes()).decode() for n in PNGS},
               "pages": [{"url": f"http://127.0.0.1:{server.server_address[1]}/",
                          "precision": "fp32"}]}
        (tmp_path / "job.json").write_text(json.dumps(job))
        r = _run(["node", "testing/chromium.mjs", str(tmp_path / "job.json")], WEB, timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    page = json.loads(r.stdout)["pages"][0]
    assert page["info"]["backend"] == "onnxruntime-web" and page["info"]["threads"] == 2
    for name in PNGS:
        got = np.asarray(page["results"][name]["logits"], np.float64)
        ref = want[name]["logits"].astype(np.float64)
        cosine = got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref))
        assert cosine >= 0.9999, f"{name}: cosine {cosine}"
        assert page["results"][name]["top"][0]["index"] == want[name]["top"][0], name
