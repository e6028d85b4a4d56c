"""The docs pages' code, followed in order as a reader would, on a CPU-only machine without a
network: every command line, Python, JavaScript and HTML block of each page below runs (or is
checked) in a directory laid out like a checkout, after `make export` as getting-started.md
has it. ViT-B/16 lines run on the tiny model with the same flags (the bundle keeps its name),
as in tests/test_tour.py. What cannot run here is listed in NOT_HERE with the reason and the
test that covers it instead; a synopsis (placeholders such as BUNDLE) is not a command to
run, and tests/test_docs.py checks its options. A snippet that is none of these runs, so a
page cannot gain code this test passes over: tests/snippets.py refuses blocks it cannot
read."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from snippets import Snippet, snippets

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["getting-started.md", "runtime.md", "browser-and-node.md", "proving.md",
         "edge-targets.md", "arm64.md", "checkpoints.md", "serving.md", "command-line.md"]

# (page, how the snippet starts) -> why it cannot run here, and where it is tested instead
NOT_HERE = {
    ("getting-started.md", "make test"):
        "runs the whole suite, this test included: the Makefile's test target, which CI runs",
    ("browser-and-node.md", "cd web && npm pack"):
        "writes a tarball into the checkout's web/: tests/test_web_package.py packs web/ and "
        "installs the tarball into a fresh project",
    ("browser-and-node.md", "npm install /path/to/"):
        "an app's install of that tarball: tests/test_web_package.py",
    ("proving.md", "node scripts/page_report.mjs"):
        "needs the site served (`--serve`, dropped above) and headless Chromium: the page's "
        "check panel is tested in tests/website/test_web.py; the committed Chromium reports stand in "
        "for these two lines' output below",
    ("edge-targets.md", "make gpu-check"):
        "needs a CUDA GPU: tests/targets/test_targets.py (no CUDA: says so, exits non-zero), "
        "tests/test_references.py (its steps on the CPU, torch blocked)",
    ("arm64.md", "sudo make check-arm64"):
        "root, binfmt_misc, qemu and debootstrap: tests/test_arm64.py (every refusal, the "
        "comparison and the check table)",
    ("arm64.md", "apt-get install"):
        "root and a network: tests/test_system_packages.py (stubbed apt-get)",
    ("checkpoints.md", "import timm"):
        "timm does not install beside the pinned torch, and pretrained=True downloads: "
        "tests/export/test_checkpoints.py (timm layouts by their documented keys)",
    ("checkpoints.md", "vit-deploy export --checkpoint hf:"):
        "downloads from the Hugging Face hub: tests/export/test_hub.py (an offline cache)",
    ("checkpoints.md", "HF_HUB_OFFLINE=1 vit-deploy export --checkpoint hf:"):
        "reads the hub's cache that the line above fills: tests/export/test_hub.py (offline)",
    ("checkpoints.md", "vit-deploy export --checkpoint timm:"):
        "downloads from the Hugging Face hub: tests/export/test_hub.py (an offline cache)",
    ("serving.md", "docker run"):
        "a container engine and Triton's image (a network): tests/test_triton.py parses the "
        "repository with Triton's own protobuf",
    ("serving.md", "vit-deploy serve vit-B16-448 --name vit_b16"):
        "a server that runs until stopped: tests/serve/test_server.py, tests/serve/test_server_v2.py",
    ("serving.md", "python examples/oip_client.py"):
        "needs the server above: tests/serve/test_server_v2.py",
}
# A synopsis (placeholders such as BUNDLE) is not a command to run; where its options are held
SYNOPSIS = {"vit-deploy": "a synopsis: tests/test_docs.py checks that the CLI has its options",
            "node examples/classify_node.mjs": "a synopsis: its options run in tests/website/test_web.py"}
UNCLASSIFIED = "a synopsis of a command SYNOPSIS does not name: say where its options are held"
HTML = ("a page for a browser: here its /node_modules/ paths are checked to exist; "
        "tests/test_web_package.py serves a page that imports 'vit-deploy' through an import "
        "map to headless Chromium")

# What a page takes as already there (its prose says so), made before its first snippet.
# {started}: the directory in which getting-started.md ran (`make export`'s bundle).
GIVEN = {
    "runtime.md": ["cp -r {started}/vit-B16-448 ."],
    # `ViT.load('bundle/', { precision: 'int8' })`: a bundle with int8, as the tour adds it
    # the site the synopsis writes, to hold the page's listing of it against
    "browser-and-node.md": ["cp -r {started}/vit-B16-448 bundle",
                            "vit-deploy quantize bundle --precision int8 --quiet",
                            "vit-deploy web bundle --out SITE --precision int8 --quiet"],
    # "The tiny bundle with fp32 and int8"; the reports directory of a checkout, holding the
    # Chromium and aarch64 reports the lines that cannot run here would have made
    "proving.md": ["vit-deploy export --model tiny --res 48x64 --out vit-tiny-48x64 --quiet",
                   "vit-deploy quantize vit-tiny-48x64 --precision int8 --quiet",
                   "mkdir -p docs/reports tmp",
                   "cp {root}/docs/reports/chromium-*.json {root}/docs/reports/aarch64-check.json "
                   "docs/reports/"],
    "serving.md": ["cp -r {started}/vit-B16-448 ."],
    "command-line.md": ["cp -r {started}/vit-B16-448 ."],
}
# Lines run in another directory (relative to the page's), as the page says
CWD = {("proving.md", "vit-deploy bench --compare"): "docs/reports"}  # "(run in docs/reports/)"
# Lines run where `import torch` fails, as the page says
NO_TORCH = {("proving.md", "vit-deploy check vit-tiny-48x64"): "in a Python where `import "
                                                               "torch` fails"}
NO_TORCH_SHIM = "import sys\nfor _n in ('torch', 'torchvision'):\n    sys.modules[_n] = None\n"
# What a line's output must hold (what the page shows it printing, less the parts that
# depend on the model: the tiny stand-in has 10 classes, not 1000)
EXPECT = {
    ("proving.md", "vit-deploy check vit-tiny-48x64"):
        ["vit-tiny-48x64 vs golden references (pytorch fp32, torch 2.13.0)", "check: PASS"],
    ("proving.md", "vit-deploy bench --compare"): ["[1] python-x86-", "check PASS"],
    ("serving.md", "vit-deploy triton"):
        ["wrote repo/vit_b16/config.pbtxt and repo/vit_b16/1/model.onnx"],
    ("serving.md", "cat repo/vit_b16/config.pbtxt"):
        ['name: "vit_b16"', 'platform: "onnxruntime_onnx"', "max_batch_size: 8",
         'name: "pixel_values"', "dims: [ 3, -1, -1 ]", 'name: "logits"',
         "count: 2 kind: KIND_CPU", "max_queue_delay_microseconds: 1000"],
    ("command-line.md", "| python -m json.tool"): ['"format_version"'],
    ("command-line.md", "| jq .passed"): ["true"],
    ("runtime.md", "vit-deploy providers"): ["cpu"],
    ("runtime.md", "examples/classify.py"): ["eval-chelsea.jpg"],
}
# The JavaScript blocks' free names, given as a reader's app would have them
JS_GIVEN = {
    "browser-and-node.md": "const fileOrBlobOrUrl = 'vit_deploy/data/photos/eval-chelsea.jpg';\n"
                           "const float32Pixels = new Float32Array(1 * 3 * 224 * 224);\n",
}
# Appended to a JS block (and only that run): what its results must be
JS_CHECK = {
    ("browser-and-node.md", "vit.classify(fileOrBlobOrUrl"):
        "if (top.length !== 5 || !(raw instanceof Float32Array) || raw.length !== 10"
        " || !(logits.length === 10) || !inputSize || !ms || vit.info.provider !== 'cpu')"
        " throw new Error('unexpected results');",
    ("browser-and-node.md", "vit.check("):
        "if (typeof report.passed !== 'boolean' || !report.cases.length"
        " || !report.latency.length) throw new Error('no report');",
}
# A listing's entries that must be files here: (page, its first word) -> the directory
LISTED = {
    ("getting-started.md", "vit-B16-448/"): "vit-B16-448",
    ("browser-and-node.md", "SITE/"): "SITE",
    ("browser-and-node.md", "common.mjs"): str(ROOT / "web" / "src" / "lib"),
}


def _matches(table: dict, page: str, text: str) -> list:
    """The values of a table's (page, piece) keys whose piece is in this snippet's text."""
    return [value for (p, piece), value in table.items() if p == page and piece in text]


def _not_here(page: str, text: str) -> str | None:
    """Why a snippet cannot run here: the NOT_HERE entry it starts with (a new line on a page
    is run, or classified here, never caught by a piece of another line)."""
    return next((why for (p, start), why in NOT_HERE.items()
                 if p == page and text.startswith(start)), None)


def _placeholders(cmd: str) -> list[str]:
    words = re.split(r"[\s\[\]|,]+", re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+", "", cmd))
    return [w for w in words if re.fullmatch(r"[A-Z][A-Z0-9_]*(?:\.\.\.|=\w*)?|\.\.\.|"
                                             r"[A-Z]+\.\w+", w)]


def _make_export() -> str:
    args = re.search(r"^ARGS \?= (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    return f"vit-deploy export {args}"


def as_run(page: str, snippet: Snippet) -> tuple[str | None, str]:
    """(the command line as it runs here, or None; why not, or how it was changed)."""
    cmd = snippet.text
    if why := _not_here(page, cmd):
        return None, why
    if _placeholders(cmd):
        return None, next((why for start, why in SYNOPSIS.items() if cmd.startswith(start)),
                          UNCLASSIFIED)
    notes = []
    if cmd == "make export":
        cmd = _make_export()
        notes.append("make export: what it runs")
    argv = shlex.split(cmd.replace("[", " ").replace("]", " ")) if "[" in cmd else None
    if argv is not None:  # optional groups without placeholders: run with every one given
        cmd = shlex.join(argv)
        notes.append("optional [...] given")
    argv = shlex.split(cmd) if not re.search(r"[|&;]", cmd) else None
    if argv and argv[:2] == ["vit-deploy", "export"] and "--model" not in argv \
            and "--checkpoint" not in argv:  # ViT-B/16: the tiny model, the same flags and name
        res = argv[argv.index("--res") + 1] if "--res" in argv else "224"
        patch = argv[argv.index("--patch") + 1] if "--patch" in argv else "16"
        argv += ["--model", "tiny"] + ([] if "--out" in argv else ["--out", f"vit-B{patch}-{res}"])
        notes.append("the tiny model for ViT-B/16")
    if argv and argv[:2] == ["vit-deploy", "web"] and "--serve" in argv:
        # serving the site is tested in tests/website/test_web.py
        for opt in ("--port", "--host"):
            if opt in argv:
                del argv[argv.index(opt):argv.index(opt) + 2]
        argv.remove("--serve")
        notes.append("without --serve")
    if argv is not None:
        cmd = shlex.join(argv)
    if "/tmp/" in cmd:  # nothing written outside the test's directory
        cmd = cmd.replace("/tmp/", "tmp/")
        notes.append("/tmp/ under the page's directory")
    return cmd, "; ".join(notes)


@dataclass
class PageRun:
    page: str
    ran: list[str] = field(default_factory=list)
    not_run: list[tuple[int, str, str]] = field(default_factory=list)  # line, text, why
    shown: list[tuple[int, str]] = field(default_factory=list)  # listings, outputs, JSON
    failures: list[str] = field(default_factory=list)


def _env(extra_path: Path | None = None) -> dict[str, str]:
    path = f"{extra_path}{os.pathsep}{ROOT}" if extra_path else str(ROOT)
    return os.environ | {"PYTHONPATH": path, "COLUMNS": "150",
                         "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _checkout(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for name in ("vit_deploy", "examples", "node_modules", "scripts"):
        if not (work / name).exists():
            (work / name).symlink_to(ROOT / name)


def run_page(page: str, work: Path, started: Path | None = None) -> PageRun:
    _checkout(work)
    shim = work / "no-torch"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(NO_TORCH_SHIM)
    result = PageRun(page)

    def sh(cmd: str, cwd: Path = work, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"set -eo pipefail\n{cmd}"], cwd=cwd,
                              env=env or _env(), capture_output=True, text=True, timeout=300)

    for given in GIVEN.get(page, []):
        r = sh(given.format(started=started, root=ROOT))
        assert r.returncode == 0, \
            f"{page}: given {given!r}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    js_before = JS_GIVEN.get(page, "")
    for s in snippets((ROOT / "docs" / page).read_text()):
        where = f"docs/{page}:{s.line}"
        if s.kind == "shown":
            first = s.text.split()[0] if s.text.split() else ""
            result.shown.append((s.line, first))
            if (page, first) in LISTED:
                base = work / LISTED[(page, first)]
                lines = [line for line in s.text.splitlines()[int(first.endswith("/")):]
                         if line.strip()]  # a tree's entries, or a listing's, without its root
                indent = min(len(line) - len(line.lstrip()) for line in lines)
                entries = [line.split()[0] for line in lines
                           if len(line) - len(line.lstrip()) == indent]
                missing = [e for e in entries if not (base / e).exists()]
                if missing:
                    result.failures.append(f"{where}: lists {missing}, not in {base}")
            continue
        if s.kind == "html":
            # an app's node_modules holds the package and, beside it, its dependencies: in
            # this checkout those are under web/node_modules
            for path in re.findall(r"""['"]/node_modules/([^'"]+)['"]""", s.text):
                if not any((base / path).exists() for base in
                           (work / "node_modules", ROOT / "web" / "node_modules")):
                    result.failures.append(f"{where}: /node_modules/{path} does not exist")
            result.not_run.append((s.line, s.text.splitlines()[0], HTML))
            continue
        if s.kind == "js":
            check = "\n".join(_matches(JS_CHECK, page, s.text))
            program = f"{js_before}\n{s.text}\n{check}\n"
            js_before += "\n" + s.text
            r = subprocess.run(["node", "--input-type=module", "-e", program], cwd=work,
                               env=_env(), capture_output=True, text=True, timeout=300)
            text = s.text.splitlines()[0]
        elif s.kind == "python":
            if why := _not_here(page, s.text):
                result.not_run.append((s.line, s.text.splitlines()[0], why))
                continue
            r = subprocess.run([sys.executable, "-c", s.text], cwd=work, env=_env(),
                               capture_output=True, text=True, timeout=300)
            text = s.text.splitlines()[0]
        else:
            cmd, why = as_run(page, s)
            if cmd is None:
                result.not_run.append((s.line, s.text, why))
                if why == UNCLASSIFIED:
                    result.failures.append(f"{where}: {s.text!r}: {why}")
                continue
            env = _env(shim) if _matches(NO_TORCH, page, s.text) else None
            cwd = work / next(iter(_matches(CWD, page, s.text)), ".")
            r = sh(cmd, cwd=cwd, env=env)
            text = cmd
            for expected in [e for group in _matches(EXPECT, page, s.text) for e in group]:
                if expected not in r.stdout:
                    result.failures.append(f"{where}: {cmd!r} printed no {expected!r}:\n"
                                           f"{r.stdout[-1500:]}")
        if r.returncode != 0 or "Traceback" in r.stderr:
            result.failures.append(f"{where}: {text!r} exited {r.returncode}\n"
                                   f"{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
        result.ran.append(text)
    return result


# --- what the pages hold (fast) --------------------------------------------------------


def test_every_snippet_of_every_page_is_read_and_classified():
    """Every page's code reads as snippets; every command line runs, is a synopsis or says
    where it is tested; every NOT_HERE entry still matches a line of its page."""
    used = set()
    for page in PAGES:
        found = snippets((ROOT / "docs" / page).read_text())
        assert found, page
        for s in found:
            if s.kind == "shell":
                cmd, why = as_run(page, s)
                assert cmd or why not in ("", UNCLASSIFIED), (page, s.line, s.text, why)
            used |= {key for key in NOT_HERE if key[0] == page and s.text.startswith(key[1])}
    assert used == set(NOT_HERE), set(NOT_HERE) - used
    for table in (GIVEN, JS_GIVEN):
        assert set(table) <= set(PAGES)
    for key in (*EXPECT, *JS_CHECK, *CWD, *NO_TORCH, *LISTED):
        assert any(key[1] in s.text for s in snippets((ROOT / "docs" / key[0]).read_text())), key


def test_a_synopsis_is_told_from_a_command_line():
    assert _placeholders("vit-deploy web BUNDLE --out SITE [--threads N]") == \
        ["BUNDLE", "SITE", "N"]
    assert _placeholders("node examples/classify_node.mjs BUNDLE IMAGE... [--top-k 5]")
    assert _placeholders("HF_HUB_OFFLINE=1 vit-deploy export --checkpoint hf:a/b --out c") == []
    assert _placeholders("vit-deploy predict vit-B16-448 a.jpg --top-k 3 [--json]") == []
    run, why = as_run("runtime.md", Snippet(
        "shell", "vit-deploy predict b a.jpg [--provider cuda,cpu --fallback] [--json]", 1))
    assert run == "vit-deploy predict b a.jpg --provider cuda,cpu --fallback --json", why
    run, _ = as_run("proving.md", Snippet(
        "shell", "vit-deploy web /tmp/c3/b --out /tmp/c3/site --threads 2 --serve --port 8080", 1))
    assert run == "vit-deploy web tmp/c3/b --out tmp/c3/site --threads 2"
    run, _ = as_run("getting-started.md", Snippet("shell", "make export", 1))
    assert run == "vit-deploy export --patch 16 --res 448 --model tiny --out vit-B16-448"


# --- the pages, run (heavy: a few tiny exports and many fresh processes) ---------------


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> tuple[Path, PageRun]:
    """getting-started.md run first, as a newcomer does: its `make export` bundle is what the
    other pages start from."""
    work = tmp_path_factory.mktemp("getting-started")
    return work, run_page("getting-started.md", work)


def _report(run: PageRun) -> str:
    lines = [f"{run.page}: ran {len(run.ran)}, not run {len(run.not_run)}, shown (not code) "
             f"{len(run.shown)}"]
    lines += [f"  not run, line {n}: {text[:80]!r}: {why}" for n, text, why in run.not_run]
    return "\n".join(lines)


@pytest.mark.heavy
@pytest.mark.parametrize("page", PAGES)
def test_every_snippet_of_the_page_runs_in_order(page, started, tmp_path):
    if page == "getting-started.md":
        run = started[1]
        assert (started[0] / "vit-B16-448" / "manifest.json").is_file()
    else:
        run = run_page(page, tmp_path / page.removesuffix(".md"), started[0])
    print(_report(run))
    assert not run.failures, "\n\n".join(run.failures)
    # a page whose every line cannot run here says so in NOT_HERE / SYNOPSIS, line by line
    assert run.ran or page in ("edge-targets.md", "arm64.md", "checkpoints.md"), _report(run)
    if page == "proving.md":
        for name in ("python-x86-fp32", "python-x86-int8", "node-x86-fp32", "node-x86-int8"):
            assert (tmp_path / "proving" / "docs" / "reports" / f"{name}.json").is_file()
        assert (tmp_path / "proving" / "tmp" / "c3" / "site" / "index.html").is_file()
