"""The package layout keeps torch apart: only vit_deploy/export/ may need it."""

import ast
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
            if info.name == "vit_deploy.server" and importlib.util.find_spec("fastapi") is None:
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
    assert {"vit_deploy.runtime", "vit_deploy.runtime.session", "vit_deploy.quantize",
            "vit_deploy.precisions", "vit_deploy.parity", "vit_deploy.cli"} <= imported
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
    files = sorted((PACKAGE / "runtime").glob("*.py"))
    assert PACKAGE / "runtime" / "session.py" in files
    offenders = {}
    for path in files:  # __init__ too: its relative imports resolve the same way
        bad = _from_export(_imported_modules(path.read_text(), f"vit_deploy.runtime.{path.stem}"))
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}
