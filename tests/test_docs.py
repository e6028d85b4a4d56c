"""The documentation: the site builds without a warning, every `vit-deploy ...` command it
shows is one the CLI accepts, its links resolve, and what it says of the setup (the Node
version) is what the project declares."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click

from vit_deploy.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- the site --------------------------------------------------------------------------


def test_the_site_builds_strict_without_a_warning(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
                        "-d", str(tmp_path / "site")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log
    problems = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not problems, log
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "guarantees" / "index.html").is_file()


# --- the command lines -----------------------------------------------------------------

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"(`+)(.+?)\1", re.S)
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
_PROMPT = re.compile(r"^\s*\$\s+")


def _indented_blocks(text: str) -> list[str]:
    """Markdown's indented code blocks: lines of 4+ spaces after a blank line that do not
    continue a list or a table (a list item's paragraphs may be caught too: harmless, only
    lines that start with `vit-deploy` are read from a block)."""
    blocks: list[str] = []
    block: list[str] | None = None
    prev_blank = True
    for line in text.split("\n"):
        if block is not None and (line.startswith("    ") or not line.strip()):
            block.append(line[4:])
            continue
        if block is not None:
            blocks.append("\n".join(block))
            block = None
        body = line.lstrip()
        if prev_blank and line.startswith("    ") and not re.match(r"[-*|]|\d+\.", body):
            block = [line[4:]]
            continue
        prev_blank = not body
    if block is not None:
        blocks.append("\n".join(block))
    return blocks


def _block_commands(block: str) -> list[str]:
    """Logical `vit-deploy` lines of a code block: backslash continuations and the
    synopsis's indented `[--option ...]` lines are joined to the line they continue."""
    commands: list[str] = []
    current: str | None = None
    continues = False
    for raw in block.split("\n"):
        line = _PROMPT.sub("", raw)
        stripped = line.strip()
        if current is not None and (continues or (raw[:1].isspace()
                                                  and stripped.startswith(("[", "--")))):
            current += " " + stripped.rstrip("\\")
        else:
            if current is not None:
                commands.append(current)
            current = stripped.rstrip("\\") if stripped.startswith("vit-deploy ") else None
        continues = stripped.endswith("\\")
    if current is not None:
        commands.append(current)
    return commands


def _commands(text: str) -> list[str]:
    """Every `vit-deploy ...` command line in a page: in fenced and indented code blocks,
    and in inline code (which may run over a line break)."""
    found: list[str] = []
    for m in _FENCE.finditer(text):
        found += _block_commands(m.group(1))
    text = _FENCE.sub("", text)
    for block in _indented_blocks(text):
        found += _block_commands(block)
    for m in _INLINE.finditer(text):
        code = _PROMPT.sub("", " ".join(m.group(2).split()))
        if code.startswith("vit-deploy "):
            found.append(code)
    return found


def _first_command(line: str) -> str:
    """The line up to a shell comment, pipe, `&&` or `;` (each between spaces) outside the
    synopsis's brackets: `a|b` and `[--res R | --res HxW]` are alternatives, not pipes."""
    depth, i = 0, 0
    while i < len(line):
        c = line[i]
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
        elif depth <= 0 and line[i - 1:i].isspace() and (
                line.startswith(("| ", "; ", "&& ", "# "), i) or line[i:] in "|;#"):
            return line[:i]
        i += 1
    return line


def _options(params: list[click.Parameter]) -> set[str]:
    return {o for p in params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


def _problems(line: str) -> list[str]:
    """What the CLI would refuse in one documented command line: an unknown subcommand or an
    option the subcommand does not have. Arguments are not counted: a documented synopsis
    has placeholders, and what follows an option is taken as its value(s)."""
    words = _first_command(line).split()
    assert words[0] == "vit-deploy", line
    ctx = click.Context(main, info_name="vit-deploy")
    if len(words) == 1:
        return []
    name = words[1]
    if name.startswith("-"):  # vit-deploy --help, --version
        known = _options(main.get_params(ctx))
        return [f"vit-deploy has no option {name}"] if name not in known else []
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        return []  # a placeholder: vit-deploy ... [options], vit-deploy COMMAND
    command = main.get_command(ctx, name)  # resolves a lazily loaded command too
    if command is None:
        return [f"no command {name!r} (commands: {', '.join(main.list_commands(ctx))})"]
    known = _options(command.get_params(click.Context(command, info_name=name, parent=ctx)))
    rest = " ".join(words[2:])
    return [f"{name} has no option {opt}" for opt in _OPTION.findall(rest) if opt not in known]


def _documented_commands() -> list[tuple[str, str]]:
    return [(_rel(page), line) for page in PAGES for line in _commands(page.read_text())]


def test_the_command_line_parser_reads_what_the_pages_write():
    page = """
Text `vit-deploy check B --require`, and one over a line break: `vit-deploy bench
B --runs 3`; not a command: `vit-deploy`, `triton --out`.

    vit-deploy export --checkpoint x \\
        --res 64 --out y
    python examples/feature_pca.py a b c

```
$ vit-deploy predict B cat.jpg [--provider cuda,cpu --fallback]   # comment --nope
vit-deploy export [--model Ti|S|B] [--patch P]
                  [--native-res R]
vit-deploy sweep C [--merge-tokens 0,4,8 | 0;4,4,2,2] [--json F]
node examples/classify_node.mjs BUNDLE [--top-k 5]
```
"""
    assert _commands(page) == [
        "vit-deploy predict B cat.jpg [--provider cuda,cpu --fallback]   # comment --nope",
        "vit-deploy export [--model Ti|S|B] [--patch P] [--native-res R]",
        "vit-deploy sweep C [--merge-tokens 0,4,8 | 0;4,4,2,2] [--json F]",
        "vit-deploy export --checkpoint x  --res 64 --out y",
        "vit-deploy check B --require",
        "vit-deploy bench B --runs 3",
    ]
    assert _problems("vit-deploy predict B a.jpg --top-k 3 | head  # --nope") == []
    assert _first_command("vit-deploy target B --target cpu|npu --buckets 224 | x") == \
        "vit-deploy target B --target cpu|npu --buckets 224 "
    assert _problems("vit-deploy bench --compare a.json b.json c.json --plot p.png") == []
    assert _problems("vit-deploy ... [options]") == []
    assert _problems("vit-deploy export --no-such-flag") == ["export has no option --no-such-flag"]
    assert _problems("vit-deploy exprot B")[0].startswith("no command 'exprot'")


def test_every_documented_command_line_is_one_the_cli_accepts():
    documented = _documented_commands()
    # The README's tour shows every command; the command-line page shows them all again.
    ctx = click.Context(main, info_name="vit-deploy")
    shown = {line.split()[1] for _, line in documented if len(line.split()) > 1}
    assert set(main.list_commands(ctx)) <= shown
    problems = [f"{page}: {line!r}: {p}" for page, line in documented for p in _problems(line)]
    assert not problems, "\n".join(problems)


# --- links -----------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    from markdown.extensions.toc import slugify  # what the site's toc extension uses

    text = _FENCE.sub("", page.read_text())
    return {slugify(re.sub(r"[`*]", "", m.group(1)), "-")
            for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readmes_links_resolve():
    readme = ROOT / "README.md"
    links = [m.group(1) for m in _LINK.finditer(_FENCE.sub("", readme.read_text()))]
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if re.match(r"[a-z]+://|mailto:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (readme.parent / path) if path else readme
        assert target.exists(), f"README.md links to {link}, which does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"README.md links to {link}: no such heading"


# --- what the pages say of the setup ---------------------------------------------------


def test_the_node_version_in_the_docs_is_the_one_package_json_declares():
    package = json.loads((ROOT / "web" / "package.json").read_text())
    engines = package["engines"]["node"]
    m = re.fullmatch(r">=\s*(\d+)", engines)
    assert m, f"web/package.json engines.node is {engines!r}; expected '>=N'"
    major = m.group(1)
    lock = json.loads((ROOT / "web" / "package-lock.json").read_text())
    assert lock["packages"][""]["engines"]["node"] == engines, "package-lock.json is stale"
    said = [(_rel(page), v) for page in PAGES
            for v in re.findall(r"Node(?:\.js)?\s*(?:≥|>=)\s*(\d+)", page.read_text())]
    assert any(page == "README.md" for page, _ in said), "README.md names no Node version"
    assert all(v == major for _, v in said), f"package.json: {engines}; the docs say {said}"


def test_every_test_the_guarantees_name_exists():
    text = (ROOT / "docs" / "guarantees.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert len(named) >= 20
    for path, name in named:
        source = ROOT / path
        assert source.is_file(), f"guarantees.md names {path}, which does not exist"
        if name:
            assert re.search(rf"^\s*def {name}\(", source.read_text(), re.M), \
                f"guarantees.md names {path}::{name}, which does not exist"
    # Every table row names at least one test.
    rows = [line for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| guarantee", "|---"))]
    assert rows and all("`tests/" in row.rsplit("|", 2)[1] for row in rows), rows


# Names of files the tools write or ONNX Runtime's documentation holds, not ours to ship
WRITTEN_NOT_SHIPPED = {"report.md", "c.md", "table.md", "coreml_supported_mlprogram_ops.md",
                       "coreml_supported_neuralnetwork_ops.md"}


def test_no_source_doc_or_help_cites_a_document_the_repository_does_not_hold():
    """Every markdown file named in a tracked source, test, script or page is a file here (beside
    the citing file, at the root, under docs/ or web/, or beside the package data): the
    project's own docs hold what it cites."""
    root = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.split()
    cite = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)\b")
    bases = [root, root / "docs", root / "web", root / "vit_deploy" / "data",
             root / "vit_deploy" / "data" / "photos"]
    missing = []
    for name in tracked:
        if not name.endswith((".py", ".md", ".mjs", ".ts", ".toml", ".cfg", ".yml")) \
                and name != "Makefile":
            continue
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        if name == "tests/test_docs.py":
            continue  # this test names what must not be cited
        for m in cite.finditer(text):
            ref = m.group(1)
            if Path(ref).name in WRITTEN_NOT_SHIPPED:
                continue
            if not any((base / ref).exists() for base in [(root / name).parent, *bases]):
                missing.append(f"{name}: {ref}")
    assert not missing, missing
    help_text = "\n".join(main.get_command(click.Context(main), c).get_help(
        click.Context(main.get_command(click.Context(main), c), info_name=c))
        for c in main.list_commands(click.Context(main)))
    assert "DESIGN.md" not in help_text
