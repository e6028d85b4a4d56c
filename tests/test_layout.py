"""The package layout keeps torch apart: only vit_deploy/export/ may need it."""

import ast
import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vit_deploy

PACKAGE = Path(vit_deploy.__file__).parent

# Imports every module of vit_deploy except those under vit_deploy/export/, without
# importing that package either (pkgutil.walk_packages would import it to look inside).
_IMPORT_ALL_BUT_EXPORT = textwrap.dedent("""
    import importlib, importlib.util, json, pkgutil, sys

    import vit_deploy

    imported, skipped = ["vit_deploy"], []

    def walk(path, prefix):
        for info in pkgutil.iter_modules(path, prefix):
            if info.name == "vit_deploy.export":
                continue
            if info.name == "vit_deploy.serve" and importlib.util.find_spec("fastapi") is None:
                skipped.append(info.name)
                continue
            module = importlib.import_module(info.name)
            imported.append(info.name)
            if info.ispkg:
                walk(module.__path__, info.name + ".")

    walk(vit_deploy.__path__, "vit_deploy.")
    torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    print(json.dumps({"imported": imported, "skipped": skipped, "torch": torch}))
""")


def test_everything_outside_export_imports_without_torch():
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL_BUT_EXPORT], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    imported = set(report["imported"])
    assert not any(m.startswith("vit_deploy.export") for m in imported)
    # not vacuous: the runtime, the torch-free tools at the top and the CLI were imported
    assert {"vit_deploy.runtime", "vit_deploy.runtime.session", "vit_deploy.precisions.quantize",
            "vit_deploy.precisions.add", "vit_deploy.parity", "vit_deploy.cli"} <= imported
    assert report["torch"] == [], (report["torch"][:5], "imported by one of", report["imported"])


def _imported_modules(source: str, module: str) -> set[str]:
    """Every module `source` (the text of `module`) may import: import statements at any
    depth (lazy ones in functions too), relative ones resolved, `from a import b` counted as
    both a and a.b, and importlib.import_module / __import__ of a literal name."""
    package = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            found.add(node.args[0].value)
    return found


def _from_export(names: set[str]) -> set[str]:
    return {n for n in names if n == "vit_deploy.export" or n.startswith("vit_deploy.export.")}


@pytest.mark.parametrize("source,found", [
    ("from vit_deploy.export.model import ViT", {"vit_deploy.export.model",
                                                 "vit_deploy.export.model.ViT"}),
    ("def f():\n    import vit_deploy.export.bundle", {"vit_deploy.export.bundle"}),
    ("from ..export import onnx", {"vit_deploy.export", "vit_deploy.export.onnx"}),
    ("from .. import export", {"vit_deploy.export"}),
    ("import importlib\nimportlib.import_module('vit_deploy.export')", {"vit_deploy.export"}),
    ("from . import manifest\nfrom ..sizes import grid_of\nimport numpy", set()),
], ids=["from-absolute", "lazy-import", "from-relative", "relative-package", "import_module",
        "clean"])
def test_the_import_scan_sees_every_form(source, found):
    assert _from_export(_imported_modules(source, "vit_deploy.runtime.x")) == found


def test_runtime_imports_nothing_from_export():
    files = sorted((PACKAGE / "runtime").rglob("*.py"))  # runtime/naflex/ too
    assert {PACKAGE / "runtime" / "session.py", PACKAGE / "runtime" / "naflex" / "session.py"
            } <= set(files)
    offenders = {}
    for path in files:  # __init__ too: its relative imports resolve the same way
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        bad = _from_export(_imported_modules(path.read_text(), module))
        if bad:
            offenders[module] = sorted(bad)
    assert offenders == {}


# -- the house: the runtime is a leaf, and no module imports itself round a circle --------
def _package_graph() -> dict[str, set[str]]:
    """{module: the vit_deploy modules it imports} over every module of the package, lazy
    imports included. `from a import b` is an edge to a.b when that is a module, else to a
    (a package's __init__ is a module of its own)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        module = f"{name}.__init__" if path.name == "__init__.py" else name
        found = _imported_modules(path.read_text(), module)
        edges = {n for n in found if n in modules}
        # `from a import b` also names a: drop it where a.b (a module) is what was imported
        edges -= {n.rsplit(".", 1)[0] for n in edges if n.rsplit(".", 1)[0] in edges
                  and modules[n.rsplit(".", 1)[0]].name == "__init__.py"
                  and not _imports_from_init(path.read_text(), n)}
        graph[name] = edges - {name}
    return graph


def _imports_from_init(source: str, submodule: str) -> bool:
    """Whether `source` also takes a name from the package __init__ above `submodule`."""
    package, _, child = submodule.rpartition(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            if any(alias.name != child for alias in node.names):
                return True
        if isinstance(node, ast.Import) and any(a.name == package for a in node.names):
            return True
    return False


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_anywhere_in_the_package():
    graph = _package_graph()
    assert {"vit_deploy.cli", "vit_deploy.runtime.session", "vit_deploy.atomic"} <= set(graph)
    assert "vit_deploy.runtime.swap" in graph["vit_deploy.runtime.manifest"]  # edges are seen
    assert _cycles(graph) == []


def test_the_runtime_imports_only_itself():
    """What apps embed ships alone: no module under runtime/ imports the rest of vit_deploy."""
    graph = _package_graph()
    runtime = {m for m in graph if m == "vit_deploy.runtime" or m.startswith("vit_deploy.runtime.")}
    assert len(runtime) >= 10
    outside = {m: sorted(e for e in graph[m] if e not in runtime) for m in sorted(runtime)}
    assert {m: e for m, e in outside.items() if e} == {}




# -- the layer table (docs/layout.md): which floor may import which ------------------------
KIT = {"outputs", "parity", "atomic", "progress", "data"}
TOOLS = {"precisions", "check", "reports", "bench", "targets", "website", "info", "predict",
         "sweep", "triton"}
SERVERS = {"serve", "ray"}
# {unit: the units it may import}; a unit is a top-level module or package of vit_deploy
LAYERS: dict[str, set[str]] = {
    "runtime": set(),
    **{k: KIT for k in KIT},
    "export": KIT,
    **{t: KIT | {"export"} for t in TOOLS},
    "serve": KIT | {"triton"},
    "ray": KIT | {"triton", "serve"},
}
TOOL_ARROWS = {("bench", "reports"), ("bench", "precisions"), ("check", "reports"),
               ("check", "precisions"),  # the neighbour agreement (precisions/agreement.py)
               ("targets", "precisions"),
               ("targets", "info"), ("sweep", "precisions")}


def _unit(module: str) -> str:
    """vit_deploy.precisions.add -> precisions; vit_deploy.parity -> parity."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _outside_the_table(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, edges in sorted(graph.items()):
        a = _unit(module)
        if a in ("cli", "vit_deploy"):  # the top floor; the package's __init__ imports nothing
            continue
        for edge in sorted(edges):
            b = _unit(edge)
            if b not in (a, "runtime") and b not in LAYERS[a] and (a, b) not in TOOL_ARROWS:
                wrong.append(f"{module} -> {edge}")
    return wrong


def test_every_import_between_floors_is_in_the_layer_table():
    graph = _package_graph()
    units = {_unit(m) for m in graph} - {"vit_deploy", "cli"}
    assert units == set(LAYERS)  # every unit is placed on a floor: a new one must be, too
    assert _outside_the_table(graph) == []


def test_the_layer_table_catches_a_planted_wrong_import():
    graph = {m: set(e) for m, e in _package_graph().items()}
    graph["vit_deploy.parity"].add("vit_deploy.check.run")  # the kit reaching up to a tool
    graph["vit_deploy.website.site"].add("vit_deploy.bench.report")  # an arrow not listed
    graph["vit_deploy.runtime.session"].add("vit_deploy.outputs")
    assert _outside_the_table(graph) == ["vit_deploy.parity -> vit_deploy.check.run",
                                         "vit_deploy.runtime.session -> vit_deploy.outputs",
                                         "vit_deploy.website.site -> vit_deploy.bench.report"]


def test_no_top_level_module_belongs_to_a_family_without_a_package():
    """The top level holds the kit and one-file tools; modules that share a prefix (bench_*,
    report_*, web_* once) are a package's (tests/test_layout.py's table places it)."""
    stems = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    prefixes = [s.split("_")[0] for s in stems]
    assert {"parity", "atomic", "info"} <= set(stems)
    assert [s for s, f in zip(stems, prefixes) if prefixes.count(f) > 1 or f in packages] == []


# The modules of cli/ that are not commands: the group, the shared option types, the
# quantisation flags' one function. A command imports these, never another command.
CLI_KIT = {"vit_deploy.cli", "vit_deploy.cli.__main__", "vit_deploy.cli.group",
           "vit_deploy.cli.options", "vit_deploy.cli.params", "vit_deploy.cli.vocabulary",
           "vit_deploy.cli.quant_flags"}


def test_nothing_imports_the_cli_and_no_command_imports_another():
    """The CLI is the top floor: nothing outside cli/ imports it, and a command module imports
    only the CLI's kit (cli/export once imported cli/quantize's function)."""
    graph = _package_graph()
    cli = {m for m in graph if m == "vit_deploy.cli" or m.startswith("vit_deploy.cli.")}
    commands = cli - CLI_KIT
    assert {"vit_deploy.cli.export", "vit_deploy.cli.quantize", "vit_deploy.cli.serve"} <= commands
    into_cli = {m: sorted(graph[m] & cli) for m in sorted(set(graph) - cli) if graph[m] & cli}
    assert into_cli == {}
    between = {m: sorted(graph[m] & commands) for m in sorted(commands) if graph[m] & commands}
    assert between == {}


def test_every_package_has_its_test_folder():
    """tests/ mirrors the package: each package of code (runtime, export, serve, ray, cli)
    has tests/<name>/ with tests in it (ray/ had none)."""
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")
                      if p.parent.name != "data")  # data/ holds files, no code to test
    assert {"runtime", "export", "serve", "ray", "cli"} <= set(packages)
    tests = PACKAGE.parent / "tests"
    missing = [p for p in packages if not list((tests / p).glob("test_*.py"))]
    assert missing == []


def _package_of(module: str) -> str:
    """vit_deploy.serve.batcher -> vit_deploy.serve; vit_deploy.bench.run -> vit_deploy."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else parts[0]


def test_no_private_name_is_imported_across_a_package():
    """A name starting with _ is its package's own: no module of another package imports it
    (ray/serve_app took serve/batcher's _Job)."""
    crossing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vit_deploy"):
                private = [a.name for a in node.names
                           if a.name.startswith("_") and not a.name.startswith("__")]
                if private and _package_of(node.module) != _package_of(module):
                    crossing.append((module, node.module, private))
    assert crossing == []


# -- sizes: a module over 400 lines is a room to split; today's, listed, may not grow ------
MAX_LINES = 400
# The modules over MAX_LINES now, with their line counts (wc -l): shrink them, never add one.
OVER_MAX_LINES: dict[str, int] = {}  # none today


def _line_counts(under: Path) -> dict[str, int]:
    return {str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(under.rglob("*.py"))}


def test_no_module_is_over_400_lines_but_the_listed_ones_and_they_do_not_grow():
    sizes = _line_counts(PACKAGE)
    assert "export/checkpoints/__init__.py" in sizes  # not vacuous: packages are walked
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    new_or_grown = {name: f"{n} lines, allowed {OVER_MAX_LINES.get(name, MAX_LINES)}"
                    for name, n in over.items() if n > OVER_MAX_LINES.get(name, MAX_LINES)}
    assert new_or_grown == {}


WEB_SRC = PACKAGE.parent / "web" / "src"


def test_no_web_module_is_over_400_lines():
    """The same rule for the JavaScript runtime: every module under web/src/ (index.html is
    a page, not a module)."""
    sizes = {str(p.relative_to(WEB_SRC)): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted(WEB_SRC.rglob("*.mjs"))}
    assert {"vit-deploy.mjs", "lib/vit.mjs", "lib/onnx-metadata.mjs"} <= set(sizes)  # not vacuous
    over = {f"web/src/{name}": f"{n} lines, allowed {MAX_LINES}" for name, n in sizes.items()
            if n > MAX_LINES}
    assert over == {}, over


def test_the_checkpoint_package_keeps_small_modules_and_names_each_in_the_layout():
    """vit_deploy/export/checkpoints/: no module over 300 lines (a family is a module of its
    own), every one of them described in docs/layout.md."""
    sizes = _line_counts(PACKAGE / "export" / "checkpoints")
    assert len(sizes) >= 10 and max(sizes.values()) <= 300, sizes
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    lines = layout[layout.index("\n    checkpoints/") + 1:].splitlines()
    section = " ".join(itertools.takewhile(lambda line: line.startswith("      "), lines[1:]))
    assert [n for n in sizes if Path(n).name not in section.split()] == []


def test_every_hugging_face_family_is_registered_once():
    from vit_deploy.export.checkpoints import FAMILIES, HF_TYPES, TOWER_TYPES

    types = [t for f in FAMILIES for t in f.model_types]
    assert len(types) == len(set(types)) and set(types) == HF_TYPES | TOWER_TYPES
    modules = {p.stem for p in (PACKAGE / "export" / "checkpoints").glob("*.py")}
    assert {f.loader.__module__.rsplit(".", 1)[1] for f in FAMILIES} <= modules


def test_every_test_named_heavy_in_conftest_exists():
    """tests/conftest.py's HEAVY_TESTS names functions by hand: a renamed test would drop
    out of the list silently and slow make test-fast down."""
    import conftest

    tests_dir = Path(__file__).resolve().parent
    for file, names in conftest.HEAVY_TESTS.items():
        [path] = list(tests_dir.rglob(file))
        text = path.read_text(encoding="utf-8")
        for name in names:
            assert f"def {name}(" in text, (file, name)
