"""`vit-deploy web` and the JavaScript runtime, against Python: in Node (`node --test
web/test/`, fed reference tensors written here) and in a real headless Chromium (the
generated site from the `--serve` server).

Run as a script, this file writes the Node tests' fixtures: `python tests/website/test_web.py DIR`
(what `node --test web/test/` does by itself when VIT_DEPLOY_WEB_FIXTURES is not set).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import posixpath
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from web_node import CHROMIUM, chromium_node as _chromium_node, chromium_pages as _chromium_pages
from web_node import node as _node

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
IMAGES = ROOT / "tests" / "data" / "web"
LABELS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Preprocessing cases the JavaScript must reproduce: the manifest's rule with overrides.
PRE_CASES = [
    {"resolution": [224, 224], "resize": "shorter_side_center_crop", "interpolation": "bicubic"},
    {"resolution": [224, 224], "resize": "patch_multiple", "interpolation": "bilinear"},
    {"resolution": [48, 64], "resize": "shorter_side_center_crop", "interpolation": "nearest"},
    {"resolution": [96, 96], "resize": "patch_multiple", "interpolation": "lanczos"},
    # a checkpoint's own rules (export/sources.py): timm's crop_pct, square and not (timm's
    # ResizeKeepRatio), and squash (each side on its own, ViTImageProcessor's {height, width})
    {"resolution": [224, 224], "resize": "shorter_side_center_crop", "interpolation": "bicubic",
     "cropPct": 0.875},
    {"resolution": [48, 64], "resize": "shorter_side_center_crop", "interpolation": "bilinear",
     "cropPct": 0.9},
    {"resolution": [96, 96], "resize": "squash", "interpolation": "bicubic"},
    {"resolution": [48, 64], "resize": "squash", "interpolation": "lanczos", "cropPct": 0.9},
    {"resolution": [64, 48], "resize": "squash", "interpolation": "bilinear"},
]
# Pillow 13 runs the vertical pass first when the height shrinks by more than twice the width
# (tests/test_resample_order.py): hopper-tall.jpg (260x600) does under every rule above, the
# squash cases under several images, so both pass orders are held bit-exact.
# The dense bundle: a classifier whose logits are not its first output, with grid outputs;
# features() of these images (their grids differ from the centre crop's) against Python's.
DENSE_OUTPUTS = ("pooled", "logits", "patch_tokens")
DENSE_LAYERS = (1,)
DENSE_IMAGES = ("hopper-wide.png", "hopper-small.png")
# Golden references of the tiny bundle (deploy 48x64, native 32x32) and the dense one (32x32).


# -- fixtures: bundles and Python's reference numbers ---------------------------------------
def _external_data_bundle(src: Path, dst: Path) -> None:
    """A copy of bundle `src` whose fp32 model keeps its weights in model.onnx.data."""
    import onnx

    from vit_deploy.runtime.contract import MANIFEST_NAME, MODEL_FILE
    from vit_deploy.runtime.manifest_parts import FileEntry

    dst.mkdir(parents=True)
    model = onnx.load(str(src / MODEL_FILE))
    onnx.save_model(model, str(dst / MODEL_FILE), save_as_external_data=True,
                    location="model.onnx.data", size_threshold=1024)
    manifest = json.loads((src / MANIFEST_NAME).read_text())
    manifest["models"] = {"fp32": MODEL_FILE}
    manifest["files"] = {MODEL_FILE: asdict(FileEntry.of(dst / MODEL_FILE, "model:fp32")),
                         "model.onnx.data": asdict(FileEntry.of(dst / "model.onnx.data",
                                                                "data:fp32"))}
    if "references" in manifest:  # the golden references come along unchanged
        name = manifest["references"]["file"]
        shutil.copyfile(src / name, dst / name)
        manifest["files"][name] = asdict(FileEntry.of(dst / name, "references"))
    (dst / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def _without_output(src: Path, dst: Path, name: str) -> None:
    """A copy of bundle `src` whose fp32 model lacks output `name` (a backbone, for `logits`)."""
    import onnx

    from vit_deploy.runtime.contract import MANIFEST_NAME, MODEL_FILE
    from vit_deploy.runtime.manifest_parts import FileEntry

    shutil.copytree(src, dst)
    model = onnx.load(str(src / MODEL_FILE))
    kept = [o for o in model.graph.output if o.name != name]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    onnx.save_model(model, str(dst / MODEL_FILE))
    manifest = json.loads((src / MANIFEST_NAME).read_text())
    manifest["io"]["outputs"] = [o for o in manifest["io"]["outputs"] if o["name"] != name]
    manifest.pop("purpose")  # what it is for: read from the outputs left (as before the field)
    for case in manifest.get("references", {}).get("cases", []):  # nor its golden outputs
        case["outputs"].pop(name, None)
    manifest["models"] = {"fp32": MODEL_FILE}
    manifest["files"][MODEL_FILE] = asdict(FileEntry.of(dst / MODEL_FILE, "model:fp32"))
    (dst / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def _write_f32(path: Path, x: np.ndarray) -> str:
    np.ascontiguousarray(x, dtype=np.float32).tofile(path)
    return path.name


def make_fixtures(out: Path) -> dict:
    """Write a tiny bundle (fp32 + int8, labelled), its external-data twin, and Python's
    preprocessing tensors, logits and top-5 for every shipped image; a dense bundle (and
    its twin without logits) with Python's features() and predictions, into `out`."""
    from vit_deploy.runtime.config import variant
    from vit_deploy.export.bundle import ExportOptions, export_bundle
    from vit_deploy.export.model import build_model
    from vit_deploy.precisions.add import add_precisions
    from vit_deploy.runtime import ViTSession
    from vit_deploy.runtime.preprocess import Preprocess, load_image

    out.mkdir(parents=True, exist_ok=True)
    bundle = out / "bundle"
    model = build_model(variant("tiny"), seed=0)
    export_bundle(model, bundle, options=ExportOptions(resolution=(48, 64), simplify=False,
                                                       labels=LABELS))
    add_precisions(bundle, ["int8"])
    _external_data_bundle(bundle, out / "bundle-external")
    images = sorted(p.name for p in IMAGES.iterdir() if p.suffix in (".png", ".jpg"))
    index: dict = {"images": images, "labels": list(LABELS), "preprocess": [], "logits": [],
                   "rgb": {}}
    with ViTSession(bundle) as fp32, ViTSession(bundle, precision="int8") as int8:
        manifest = fp32.manifest
        for name in images:
            image = load_image(IMAGES / name)  # decoded, upright, RGB (alpha on white)
            rgb = np.asarray(image)
            rgb.tofile(out / f"rgb-{name}.u8")
            index["rgb"][name] = {"file": f"rgb-{name}.u8", "width": image.width,
                                  "height": image.height}
            for i, case in enumerate(PRE_CASES):
                pre = Preprocess.from_manifest(manifest, resolution=tuple(case["resolution"]),
                                               resize=case["resize"],
                                               interpolation=case["interpolation"],
                                               crop_pct=case.get("cropPct"))
                x = pre.array(image)
                index["preprocess"].append({
                    "image": name, "case": case, "dims": [1, *x.shape],
                    "file": _write_f32(out / f"pre-{name}-{i}.f32", x),
                    "steps": [manifest.preprocess.scale / s for s in manifest.preprocess.std]})
            x = fp32.preprocess().array(image)[None]
            for precision, session in (("fp32", fp32), ("int8", int8)):
                top = session.predict([IMAGES / name], top_k=5)[0].top
                index["logits"].append({
                    "image": name, "precision": precision, "dims": list(x.shape),
                    "pixels": _write_f32(out / f"x-{name}.f32", x),
                    "file": _write_f32(out / f"logits-{name}-{precision}.f32", session.run(x)),
                    "top": [{"index": c.index, "label": c.label, "probability": c.probability}
                            for c in top]})
    from vit_deploy.runtime.references import iter_references

    refs = manifest.references  # the real-photograph case's input as Python makes it
    [photo] = [x for c, x, _ in iter_references(bundle / refs.file, refs) if c.pixels is not None]
    index["photo_input"] = _write_f32(out / "photo-input.f32", photo)
    index["python_check"] = _python_check(bundle, out / "python-check.json")
    index["dense"] = _dense_fixtures(out)
    index["int8_weights_need"] = _int8_files(bundle, out)
    (out / "index.json").write_text(json.dumps(index, indent=2))
    return index


def _int8_files(bundle: Path, out: Path) -> dict[str, dict]:
    """{file: {need: what its int8 weights need of a CPU, coupled: whether a batch's images
    share an activation scale}, as Python reads the file} for the bundle's fp32 and (7-bit,
    dynamic) int8 files, an 8-bit twin and a static one: what Node's int8WeightsNeed and
    batchCoupled must read the same (web/test/int8cpu.test.mjs)."""
    from vit_deploy.parity import sample_inputs
    from vit_deploy.precisions.quantize import QuantOptions, quantize_model
    from vit_deploy.runtime.model_scan import inspect_model, int8_weights_need

    quantize_model(bundle / "model.onnx", out / "int8-8bit.onnx", precision="int8",
                   options=QuantOptions(cpu="vnni"))
    quantize_model(bundle / "model.onnx", out / "int8-static.onnx", precision="int8-static",
                   calibration=[sample_inputs((48, 64), 2, seed=s) for s in range(2)])
    files = ["bundle/model.onnx", "bundle/model.int8.onnx", "int8-8bit.onnx",
             "int8-static.onnx"]
    return {f: {"need": int8_weights_need(out / f), "coupled": inspect_model(out / f, None)}
            for f in files}


def _python_check(bundle: Path, out: Path) -> str:
    """Python's `vit-deploy check BUNDLE --reference bundle --precision fp32,int8 --json`:
    the figures vit.check() must give (web/test/check.test.mjs, the pages' checks here)."""
    from click.testing import CliRunner

    from vit_deploy.cli import main

    r = CliRunner().invoke(main, ["check", str(bundle), "--reference", "bundle", "--precision",
                                  "fp32,int8", "--quiet", "--json", str(out)])
    assert r.exit_code == 0, r.output
    return out.name


def _dense_fixtures(out: Path) -> dict:
    from vit_deploy.runtime.config import variant
    from vit_deploy.export.bundle import ExportOptions, export_bundle
    from vit_deploy.export.model import build_model
    from vit_deploy.runtime import ViTSession
    from vit_deploy.runtime.preprocess import load_image

    dense = out / "bundle-dense"
    model = build_model(variant("tiny"), seed=1)
    export_bundle(model, dense, options=ExportOptions(
        resolution=(32, 32), simplify=False, outputs=DENSE_OUTPUTS, layers=DENSE_LAYERS,
        labels=LABELS))
    _without_output(dense, out / "bundle-backbone", "logits")
    record: dict = {"outputs": [*DENSE_OUTPUTS, *(f"layer_{b}" for b in DENSE_LAYERS)],
                    "features": [], "logits": [], "embeddings": []}
    with ViTSession(dense) as session:
        assert session.output_names == record["outputs"], session.output_names
        for name in DENSE_IMAGES:
            for output in ("patch_tokens", *(f"layer_{b}" for b in DENSE_LAYERS)):
                y = session.features(IMAGES / name, output=output)
                record["features"].append({
                    "image": name, "output": output, "dims": list(y.shape),
                    "file": _write_f32(out / f"features-{name}-{output}.f32", y)})
            record["embeddings"].append({  # ViTSession.embed: what vit.embed() must give
                "image": name, "file": _write_f32(out / f"embed-{name}.f32",
                                                  session.embed(IMAGES / name)[0])})
            x = session.preprocess().array(load_image(IMAGES / name))[None]
            top = session.predict([IMAGES / name], top_k=5)[0].top
            record["logits"].append({
                "image": name, "dims": list(x.shape),
                "pixels": _write_f32(out / f"dense-x-{name}.f32", x),
                "file": _write_f32(out / f"dense-logits-{name}.f32", session.run(x)),
                "top": [{"index": c.index, "label": c.label, "probability": c.probability}
                        for c in top]})
    return record


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("web")
    make_fixtures(out)
    return out


# -- Node --------------------------------------------------------------------------------
def test_node_module_matches_python(fixtures):
    """node --test web/test/: preprocessing, logits, labels and top-k against Python."""
    node = _node()
    env = {**os.environ, "VIT_DEPLOY_WEB_FIXTURES": str(fixtures),
           "VIT_DEPLOY_PYTHON": sys.executable}  # untrusted.test.mjs writes hostile graphs
    r = subprocess.run([node, "--test", "--test-reporter=tap", "test/"], cwd=WEB, env=env,
                       capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    passed = int(re.search(r"^# pass (\d+)", r.stdout, re.MULTILINE).group(1))
    failed = int(re.search(r"^# fail (\d+)", r.stdout, re.MULTILINE).group(1))
    assert failed == 0 and passed >= 10, r.stdout[-3000:]


def _app_with_example(tmp_path: Path) -> Path:
    """examples/classify_node.mjs in an app whose node_modules/vit-deploy is web/ (linked, as
    `npm link` or make setup's link leaves it): the example imports the package by name."""
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "vit-deploy").symlink_to(WEB, target_is_directory=True)
    shutil.copy(ROOT / "examples" / "classify_node.mjs", tmp_path / "classify_node.mjs")
    return tmp_path / "classify_node.mjs"


def test_example_script_classifies_with_labels(fixtures, tmp_path):
    node = _node()
    example = _app_with_example(tmp_path)
    r = subprocess.run([node, str(example), str(fixtures / "bundle"),
                        str(IMAGES / "hopper-wide.png"), "--top-k", "3"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    index = json.loads((fixtures / "index.json").read_text())
    want = next(e for e in index["logits"] if e["image"] == "hopper-wide.png"
                and e["precision"] == "fp32")
    assert want["top"][0]["label"] in r.stdout.splitlines()[1]
    assert "cpu" in r.stdout
    bad = subprocess.run([node, str(example), str(fixtures / "bundle"), str(IMAGES / "nope.png")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode != 0 and "nope.png" in bad.stderr and "at " not in bad.stderr


# -- the site and its server ------------------------------------------------------------------
def test_web_writes_a_site_that_can_be_rewritten(fixtures, tmp_path):
    from click.testing import CliRunner

    from vit_deploy.cli import main

    site = tmp_path / "site"
    for _ in range(2):  # the second run replaces the site it wrote
        r = CliRunner().invoke(main, ["web", str(fixtures / "bundle"), "--out", str(site),
                                      "--precision", "int8,fp32", "--threads", "2"])
        assert r.exit_code == 0, r.output
    record = json.loads((site / "bundle" / "web.json").read_text())
    assert record["precisions"] == ["int8", "fp32"] and record["threads"] == 2
    assert {p.name for p in (site / "bundle").iterdir()} == {
        "manifest.json", "model.onnx", "model.int8.onnx", "references.bin", "web.json"}
    assert (site / "ort" / "ort-wasm-simd-threaded.wasm").stat().st_size > 1e6
    assert "ViT.load" in (site / "index.html").read_text()


@pytest.mark.parametrize("args,match", [
    (["--precision", "int4"], "bundle has no 'int4' model"),
    (["--precision", "fp64"], "unknown precision"),
    (["--threads", "0"], "0 is not in the range"),
])
def test_web_refuses_bad_arguments(fixtures, tmp_path, args, match):
    from click.testing import CliRunner

    from vit_deploy.cli import main

    r = CliRunner().invoke(main, ["web", str(fixtures / "bundle"), "--out", str(tmp_path / "s"),
                                  *args])
    assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "s").exists()


def test_web_refuses_a_foreign_directory_and_a_non_bundle(fixtures, tmp_path):
    from click.testing import CliRunner

    from vit_deploy.cli import main

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    r = CliRunner().invoke(main, ["web", str(fixtures / "bundle"), "--out",
                                  str(tmp_path / "mine")])
    assert r.exit_code == 2 and "not a bundle vit-deploy wrote" in r.output, r.output
    r = CliRunner().invoke(main, ["web", str(tmp_path / "mine"), "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and "not a vit-deploy bundle" in r.output, r.output
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_site_carries_every_module_the_browser_imports():
    """The JavaScript a site gets (WebSources.modules) is every module under web/src but
    Node's, and closed under its imports: the Node platform module is imported only by the
    entry that runs in both, and only in Node."""
    from vit_deploy.website.site import LIB_DIR, MODULE, NODE_ONLY, WebSources

    src = WEB / "src"
    modules = set(WebSources(WEB).modules)
    node_only = {f"{LIB_DIR}/{name}" for name in NODE_ONLY}
    every = {p.relative_to(src).as_posix() for p in src.rglob("*.mjs")}
    assert every - modules == {"node.mjs", *node_only}
    for name in sorted(modules):
        code = "\n".join(line for line in (src / name).read_text().splitlines()
                         if not line.lstrip().startswith("//"))
        imported = re.findall(r"""(?:\bfrom|\bimport\s*\()\s*['"](\.{1,2}/[^'"]+)['"]""", code)
        leaves = {f"{LIB_DIR}/common.mjs", f"{LIB_DIR}/onnx-metadata.mjs"}  # import nothing
        assert imported or name in leaves, f"{name} imports nothing?"
        for spec in imported:
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), spec))
            assert target in modules or (name == MODULE and target in node_only), \
                f"{name} imports {spec}, which the site lacks"


def test_site_keeps_external_data_beside_the_model(fixtures, tmp_path):
    from vit_deploy.website.site import write_site

    write_site(fixtures / "bundle-external", tmp_path / "site")
    record = json.loads((tmp_path / "site" / "bundle" / "web.json").read_text())
    assert record["external_data"] == {"fp32": ["model.onnx.data"]}
    assert (tmp_path / "site" / "bundle" / "model.onnx.data").is_file()


def test_preview_server_sends_isolation_headers_and_mime_types(fixtures, tmp_path):
    from vit_deploy.website.site import make_server, write_site

    write_site(fixtures / "bundle", tmp_path / "site")
    for isolation in (True, False):
        server = make_server(tmp_path / "site", port=0, isolation=isolation)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        try:
            for path, mime in (("vit-deploy.mjs", "text/javascript"),
                               ("ort/ort-wasm-simd-threaded.wasm", "application/wasm"),
                               ("index.html", "text/html; charset=utf-8"),
                               ("bundle/model.onnx", "application/octet-stream")):
                with urllib.request.urlopen(base + path, timeout=10) as response:
                    assert response.headers["Content-Type"] == mime, path
                    coop = response.headers.get("Cross-Origin-Opener-Policy")
                    coep = response.headers.get("Cross-Origin-Embedder-Policy")
                    assert (coop, coep) == (("same-origin", "require-corp") if isolation
                                            else (None, None)), path
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(base + "ort/", timeout=10)
        finally:
            server.shutdown()
            server.server_close()


# -- the preview server against hostile requests -----------------------------------------------


def _fake_site(root: Path) -> Path:
    """A site as write_site leaves it (its manifest lists its files), plus what a site
    directory may also hold and must never be served: dotfiles, an unlisted file, symlinks."""
    from vit_deploy.atomic import repository_record
    from vit_deploy.website.site import PAGE

    site = root / "site"
    (site / "bundle" / "sub").mkdir(parents=True)
    (site / PAGE).write_text("<html>page</html>")
    (site / "vit-deploy.mjs").write_text("export {};")
    (site / "bundle" / "model.onnx").write_bytes(b"\x08\x07model")
    (site / "bundle" / "sub" / "weights.data").write_bytes(b"weights")
    (site / "bundle" / "manifest.json").write_text("{}")  # written by write_site, not listed
    (site / "listed-link.txt").write_text("will become a symlink")
    (site / "manifest.json").write_text(json.dumps(repository_record(site, "bundle", "web")))
    # After the manifest: none of these is listed.
    (root / "secret.txt").write_text("outside")
    (site / ".env").write_text("TOKEN=secret")
    (site / ".git").mkdir()
    (site / ".git" / "config").write_text("[core]")
    (site / "unlisted.txt").write_text("not written by vit-deploy")
    (site / "home").symlink_to(root)
    (site / "outside.txt").symlink_to(root / "secret.txt")
    (site / "listed-link.txt").unlink()
    (site / "listed-link.txt").symlink_to(root / "secret.txt")  # listed, now a link out
    return site


@contextlib.contextmanager
def _serving(site: Path, **kwargs):
    """A preview server of `site`, serving in a thread meanwhile."""
    from vit_deploy.website.site import make_server

    server = make_server(site, port=0, **kwargs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextlib.contextmanager
def _preview(site: Path, **kwargs):
    with _serving(site, **kwargs) as server:
        yield server.server_address[1]


def _get(port: int, raw_path: str) -> tuple[int, bytes]:
    """Status and body of GET raw_path, sent as is (no client-side normalising)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {raw_path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


SERVED = {"/": b"<html>page</html>", "/index.html": b"<html>page</html>",
          "/vit-deploy.mjs": b"export {};", "/bundle/model.onnx": b"\x08\x07model",
          "/bundle/sub/weights.data": b"weights", "/bundle/./model.onnx": b"\x08\x07model",
          "/bundle/manifest.json": b"{}",
          "/index.html?v=2": b"<html>page</html>", "/bundle/%6Dodel.onnx": b"\x08\x07model"}
NOT_SERVED = ["/.env", "/.git/config", "/.git/", "/unlisted.txt", "/home/secret.txt",
              "/home/site/index.html", "/outside.txt", "/listed-link.txt", "/manifest.json",
              "/../secret.txt", "/bundle/../../secret.txt", "/%2e%2e/secret.txt",
              "/%2e%65nv", "//etc/passwd", "/bundle", "/bundle/", "/bundle/sub/",
              "/index.html%00.txt", "/site/index.html", "/nonexistent.js",
              "/bundle/model.onnx/", "/bundle/sub/manifest.json"]


def test_preview_serves_only_the_files_the_site_lists(tmp_path):
    site = _fake_site(tmp_path)
    with _preview(site) as port:
        for path, body in SERVED.items():
            assert _get(port, path) == (200, body), path
        for path in NOT_SERVED:
            status, body = _get(port, path)
            assert status == 404 and b"secret" not in body and b"TOKEN" not in body, path


def test_preview_needs_a_site_with_its_manifest(tmp_path):
    from vit_deploy.website.site import make_server

    (tmp_path / "index.html").write_text("x")
    with pytest.raises(FileNotFoundError, match="not a site written by `vit-deploy web`"):
        make_server(tmp_path, port=0)
    (tmp_path / "manifest.json").write_text(json.dumps({"files": {"other.js": "0"}}))
    with pytest.raises(FileNotFoundError, match="lists no files"):
        make_server(tmp_path, port=0)


@pytest.mark.parametrize("opening", [b"", b"GET /index.html HTTP/1.1\r\nHost", b"G"],
                         ids=["silent", "partial-headers", "one-byte"])
def test_preview_closes_idle_connections_after_its_timeout(tmp_path, opening):
    site = _fake_site(tmp_path)
    with _preview(site, timeout=0.5) as port:
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
        t0 = time.monotonic()
        for s in socks:
            s.sendall(opening)
        for s in socks:
            while s.recv(65536):  # whatever it answers, then the close: EOF
                pass
            s.close()
        assert time.monotonic() - t0 < 5
        assert _get(port, "/index.html")[0] == 200


BIG = 8 * 1024 * 1024  # a model file a client reads slowly, or not at all


def _big_site(tmp_path: Path) -> Path:
    site = _fake_site(tmp_path)
    (site / "bundle" / "model.onnx").write_bytes(b"\x08" * BIG)  # listed; sizes not checked
    return site


def _answered_or_closed(socks: list[socket.socket], within: float) -> list[float]:
    """When (time.monotonic()) each of `socks` was answered or closed by the server, in
    their order; inf for one still open after `within` seconds."""
    when = {s: float("inf") for s in socks}
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(t == float("inf") for t in when.values()):
        live = [s for s, t in when.items() if t == float("inf")]
        for s in select.select(live, [], [], 0.05)[0]:
            when[s] = time.monotonic()
    return [when[s] for s in socks]


@contextlib.contextmanager
def _slowloris(socks: list[socket.socket], every: float):
    """Each of `socks` sends one more byte of a request every `every` seconds (a header
    line that never ends) until the server answers or closes it."""
    stop = threading.Event()

    def drip():
        live = list(socks)
        while live and not stop.wait(every):
            done = select.select(live, [], [], 0)[0]
            live = [s for s in live if s not in done]
            for s in live:
                try:
                    s.send(b"a")
                except OSError:
                    pass

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _get_within(port: int, path: str, seconds: float) -> int:
    t0 = time.monotonic()
    status, _ = _get(port, path)
    assert time.monotonic() - t0 < seconds
    return status


@pytest.mark.parametrize("opening", [b"G", b"GET /index.html HTTP/1.1\r\nHost: x\r\nX-Slow: ",
                                     b"GET /bundle/model.onnx"],
                         ids=["request-line", "headers", "path"])
def test_preview_cuts_slowloris_at_its_request_deadline_and_still_answers(tmp_path, opening):
    # 16 connections each sending a byte every 0.2 s (no read is ever silent for the 1 s
    # timeout), twice the 8 connections served at once: normal GETs are answered
    # meanwhile (the oldest slow one makes way), and every slow one is closed within the
    # timeout of its connect, not held as long as it keeps dripping.
    site = _fake_site(tmp_path)
    with _preview(site, timeout=1.0, max_connections=8) as port:
        socks = []
        opened = []
        for _ in range(16):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            opened.append(time.monotonic())
            socks[-1].sendall(opening)
        with _slowloris(socks, 0.2):
            for _ in range(5):
                assert _get_within(port, "/index.html", 1.0) == 200
            closed = _answered_or_closed(socks, within=3.0)
        late = [round(c - o, 2) for o, c in zip(opened, closed) if c - o > 1.0 + 0.8]
        assert not late, late  # the deadline, not the per-read timeout
        for s in socks:
            s.close()
        assert _get_within(port, "/", 1.0) == 200


@pytest.mark.parametrize("how", ["mid-answer", "mid-headers", "before-answer"])
def test_preview_clients_that_go_away_are_one_quiet_line_each(tmp_path, caplog, capsys, how):
    site = _big_site(tmp_path)
    caplog.set_level(logging.DEBUG, logger="vit_deploy.website.preview")
    with _serving(site, timeout=1.0, max_connections=64) as server:
        port = server.server_address[1]
        for _ in range(4):
            socks = [socket.create_connection(("127.0.0.1", port), timeout=10)
                     for _ in range(32)]
            for s in socks:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                if how == "mid-headers":
                    s.sendall(b"GET /bundle/model.onnx HTTP/1.1\r\nHost")
                else:
                    s.sendall(b"GET /bundle/model.onnx HTTP/1.0\r\n\r\n")
            for s in socks:
                if how == "mid-answer":
                    s.recv(1000)  # the answer has begun
                s.close()  # a reset (linger 0), as a browser tab that is closed
        deadline = time.monotonic() + 10
        while server.live and time.monotonic() < deadline:  # each thread hears of it
            time.sleep(0.05)
        assert not server.live
        assert _get_within(port, "/index.html", 1.0) == 200
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[-2000:]
    records = [r for r in caplog.records if r.name == "vit_deploy.website.preview"]
    assert 0 < len(records) <= 128, how  # they went away, and at most one line each
    assert all(r.levelno == logging.DEBUG and r.exc_info is None and "\n" not in r.getMessage()
               for r in records), [r.getMessage() for r in records if r.levelno > logging.DEBUG]


def test_preview_bounds_its_connections(tmp_path):
    # 4 connections being answered (downloads their clients do not read) hold the 4 slots:
    # a new connection is closed on arrival. Connections waiting for their request make way.
    site = _big_site(tmp_path)
    with _serving(site, timeout=5.0, max_connections=4) as server:
        port = server.server_address[1]
        waiting = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        time.sleep(0.2)
        assert _get_within(port, "/", 1.0) == 200
        held = []
        for _ in range(4):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            held[-1].sendall(b"GET /bundle/model.onnx HTTP/1.0\r\n\r\n")
        deadline = time.monotonic() + 5
        while sum(not w for w in server.live.values()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.live) == 4 and not any(server.live.values())  # all answering
        assert all(t < float("inf") for t in _answered_or_closed(waiting, 1.0))  # made way
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            try:
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                assert s.recv(65536) == b""  # closed on arrival
            except ConnectionResetError:
                pass
            s.close()
        for s in held + waiting:
            s.close()
        deadline = time.monotonic() + 5
        while server.live and time.monotonic() < deadline:  # the held slots come back
            time.sleep(0.05)
        assert _get_within(port, "/", 1.0) == 200


# -- Chromium ----------------------------------------------------------------------------------
def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _start_cli_server(args: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "vit_deploy.cli", "web", *args, "--serve",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    for line in proc.stdout:  # the site is written first, then the URL is printed
        if m := re.search(r"on (http://\S+/)", line):
            return proc, m.group(1)
    proc.kill()
    raise AssertionError(f"vit-deploy web --serve printed no URL: {proc.stderr.read()[-2000:]}")


def test_site_in_headless_chromium(fixtures, tmp_path):
    """The generated site, served by `vit-deploy web --serve`, in Debian's Chromium:
    tensors within one 8-bit step of Python's, logits cosine >= 0.9999 and the same top-1
    as Python ONNX Runtime, two threads on a cross-origin isolated page, one thread (said
    so) on a plain host, external data passed explicitly, and a screenshot of the page."""
    from vit_deploy.website.site import make_server, write_site

    node = _chromium_node()
    index = json.loads((fixtures / "index.json").read_text())
    images = {name: base64.b64encode((IMAGES / name).read_bytes()).decode()
              for name in index["images"]}
    write_site(fixtures / "bundle-external", tmp_path / "plain")
    plain = make_server(tmp_path / "plain", port=0, isolation=False)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    proc, url = _start_cli_server([str(fixtures / "bundle"), "--out", str(tmp_path / "site"),
                                   "--precision", "fp32,int8", "--threads", "2"])
    try:
        job = {"chromium": CHROMIUM, "images": images, "pages": [
            {"url": url, "precision": "fp32", "pixels": PRE_CASES[0]},
            {"url": url, "precision": "int8"},
            {"url": f"http://127.0.0.1:{plain.server_address[1]}/", "precision": "fp32",
             "threads": 2},
            {"url": url, "precision": "fp32", "check": True}],  # no adapter: wasm only
            "screenshot": {"url": url, "image": str(IMAGES / "hopper.jpg"),
                           "path": str(tmp_path / "demo.png")}}
        pages = _chromium_pages(node, job, tmp_path, timeout=180)
    finally:
        proc.kill()
        proc.wait()
        plain.shutdown()
        plain.server_close()
    isolated, int8, external, checked = pages
    _assert_fallback_check(checked, fixtures)
    assert isolated["info"]["provider"] == "wasm" and isolated["info"]["threads"] == 2
    assert isolated["info"]["crossOriginIsolated"] and isolated["info"]["threadFallback"] is None
    assert external["info"]["threads"] == 1 and not external["info"]["crossOriginIsolated"]
    assert "COOP/COEP" in external["info"]["threadFallback"]
    logits = {(e["image"], e["precision"]): e for e in index["logits"]}
    pre = {e["image"]: e for e in index["preprocess"] if e["case"] == PRE_CASES[0]}
    for name in index["images"]:
        want = np.fromfile(fixtures / pre[name]["file"], np.float32).reshape(3, -1)
        got = np.asarray(isolated["results"][name]["pixels"], np.float32).reshape(3, -1)
        assert got.shape == want.shape, name
        steps = (np.abs(got - want) / np.asarray(pre[name]["steps"])[:, None]).max()
        assert steps <= 1 + 1e-4, f"{name}: {steps:.3f} 8-bit steps from Python's tensor"
        for page, precision in ((isolated, "fp32"), (external, "fp32"), (int8, "int8")):
            ref = logits[(name, precision)]
            want = np.fromfile(fixtures / ref["file"], np.float32)
            got = np.asarray(page["results"][name]["logits"], np.float32)
            cosine = _cosine(got, want)
            if precision == "fp32":
                assert cosine >= 0.9999, f"{name} {precision}: cosine {cosine}"
                assert page["results"][name]["top"][0]["index"] == ref["top"][0]["index"], name
            else:  # int8 rounds activations at run time: a flipped pixel may move one step
                assert cosine >= 0.99, f"{name} {precision}: cosine {cosine}"
            assert page["results"][name]["top"][0]["label"] == \
                LABELS[page["results"][name]["top"][0]["index"]]
    shot = Path(job["screenshot"]["path"]).read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000


def _report_table(report: dict) -> str:
    """The report's cases as a Markdown table (what docs/browser-and-node.md shows)."""
    lines = ["| backend | precision | case | H×W | output | max abs diff | cosine | passed |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c['provider']} | {c['precision']} | {c['label']} | "
              f"{c['resolution'][0]}×{c['resolution'][1]} | {c['output']} | {c['max_abs']:.1e} | "
              f"{c['cosine']:.9f} | {c['passed']} |" for c in report["cases"]]
    lines += [f"latency {lat['provider']} {lat['precision']} {lat['resolution']} batch "
              f"{lat['batch']}: p50 {lat['p50_ms']:.2f} ms, p90 {lat['p90_ms']:.2f} ms "
              f"({lat['runs']} runs)" for lat in report["latency"]]
    return "\n".join(lines)


def _assert_report(report: dict, fixtures: Path, bundle: str, providers: set[str]) -> None:
    """A passing check report of the shared schema: every reference case × output on each
    provider, judged by the policy's numbers (fp32: max |Δ| and cosine), with Python's
    figures (`check --reference bundle --json`: max |Δ| and the worst image's cosine): fp32
    within 1e-5; int8 (a batch runs image by image, as in Python) within 5e-4 / 5e-5: the
    page's float kernels (WebAssembly's, which also feed WebGPU's int8 nodes) likely round an
    activation otherwise now and then, moving a run-time quantisation step: 1.9e-4 / 1.3e-5
    on one case of four, the others within 3e-8 (2026-12-02). A batch quantised as one was
    up to 2.3e-3 / 2.0e-4 from Python's."""
    from vit_deploy.runtime.contract import COSINE_MIN, FP32_ABS_TOL, tolerance_class

    refs = json.loads((fixtures / bundle / "manifest.json").read_text())["references"]
    python = json.loads((fixtures / "python-check.json").read_text())["cases"]
    order = [(c["name"], o) for c in refs["cases"] for o in c["outputs"]]
    figures = {(*order[i % len(order)], c["precision"]): c for i, c in enumerate(python)}
    assert len(python) == 2 * len(order), python  # fp32 and int8, the references' order
    for c in report["cases"]:
        want = figures[(c["label"], c["output"], c["precision"])]
        assert (c["resolution"], c["batch"]) == (want["resolution"], want["batch"]), (c, want)
        max_abs, cosine = (1e-5, 1e-5) if c["precision"] == "fp32" else (5e-4, 5e-5)
        assert abs(c["max_abs"] - want["max_abs"]) <= max_abs, (c, want)
        assert abs(c["cosine"] - want["cosine"]) <= cosine, (c, want)
    assert report["schema"] == "vit-deploy-report" and report["schema_version"] == 1
    assert report["kind"] == "check" and report["passed"] is True, _report_table(report)
    assert report["device"]["runtime"].startswith("onnxruntime-web ")
    assert report["reference"].startswith("golden references (pytorch fp32, torch ")
    want = {(c["name"], o) for c in refs["cases"] for o in c["outputs"]}
    for provider in providers:
        got = {(c["label"], c["output"]) for c in report["cases"] if c["provider"] == provider}
        assert got == want, (provider, got)
    for c in report["cases"]:
        policy = tolerance_class(c["precision"])
        assert c["cosine_min"] == COSINE_MIN[policy] and c["cosine"] >= COSINE_MIN[policy]
        if policy == "fp32":
            assert c["abs_tol"] >= FP32_ABS_TOL and c["max_abs"] <= c["abs_tol"], c
    assert {lat["provider"] for lat in report["latency"]} == providers
    json.dumps(report, allow_nan=False)  # strict JSON


def _assert_fallback_check(page: dict, fixtures: Path) -> None:
    """Chromium with --disable-gpu: no adapter, so the page checks WebAssembly alone."""
    assert page["check"]["offered"]["backends"] == ["wasm"], page["check"]["offered"]
    assert page["info"]["provider"] == "wasm" and "WebGPU" in page["info"]["fallback"]
    _assert_report(page["check"]["report"], fixtures, "bundle", {"wasm"})
    assert page["check"]["report"]["device"]["gpu"] is None
    assert page["check"]["download"] == "vit-deploy-check.json"


def test_check_and_measure_on_webgpu_in_headless_chromium(fixtures, tmp_path):
    """Chromium with a WebGPU adapter (SwiftShader: software, so correctness only): the
    page's "check and measure" (?check=1) runs vit.check() on webgpu and wasm, fp32 and
    int8, every golden reference within the tolerance policy of PyTorch's outputs; fp16
    where the adapter offers shader-f16 (SwiftShader does not: said so)."""
    node = _chromium_node()
    proc, url = _start_cli_server([str(fixtures / "bundle"), "--out", str(tmp_path / "site"),
                                   "--precision", "fp32,int8", "--threads", "2"])
    try:
        job = {"chromium": CHROMIUM, "gpu": True, "images": {}, "pages": [
            {"url": url, "precision": "fp32", "check": True},
            {"url": url, "precision": "int8", "check": True}]}
        fp32, int8 = _chromium_pages(node, job, tmp_path, timeout=300)
    finally:
        proc.kill()
        proc.wait()
    for page in (fp32, int8):
        assert page["check"]["offered"]["backends"] == ["webgpu", "wasm"], page["check"]
        assert page["info"]["provider"] == "webgpu" and page["info"]["fallback"] is None
        assert "swiftshader" in page["info"]["gpu"].lower()
        _assert_report(page["check"]["report"], fixtures, "bundle", {"webgpu", "wasm"})
        print(_report_table(page["check"]["report"]))
    assert fp32["check"]["offered"]["shaderF16"] is False  # SwiftShader: no fp16 shaders


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/website/test_web.py OUT_DIR  (writes the Node tests' fixtures)")
    make_fixtures(Path(sys.argv[1]))
