"""The base install (no `export` extra) runs a bundle: no torch anywhere.

Offline: our wheel goes into a fresh venv with --no-deps, and the base dependencies
(read from our own metadata, resolved recursively) are linked in from this environment.
If the runtime ever imports something that is not a base dependency, this fails.
"""

import json
import os
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def _base_distributions() -> set[str]:
    todo = [Requirement(r) for r in metadata.requires("vit-deploy") or []]
    todo = [r for r in todo if r.marker is None or r.marker.evaluate({"extra": ""})]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for sub in metadata.requires(req.name) or []:
            r = Requirement(sub)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r)
    return seen


def _link_distribution(name: str, site: Path) -> None:
    dist = metadata.distribution(name)
    tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    base = Path(dist.locate_file(""))
    for top in tops:
        target = site / top
        if not target.exists() and (base / top).exists():
            target.symlink_to(base / top)


@pytest.mark.slow
def test_base_install_predicts_without_torch(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    deps = _base_distributions()
    assert "torch" not in deps and "onnxruntime-gpu" in deps

    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(wheel_dir), str(ROOT)], check=True)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    *map(str, wheel_dir.glob("*.whl"))], check=True)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True,
                               text=True).stdout.strip())
    for name in deps:
        _link_distribution(name, site)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    no_torch = subprocess.run([str(py), "-c", "import torch"], capture_output=True, env=env)
    assert no_torch.returncode != 0  # really no torch in there

    image = tmp_path / "img.png"
    Image.fromarray((np.arange(40 * 56 * 3) % 255).reshape(40, 56, 3).astype(np.uint8)).save(image)
    cli = env_dir / "bin" / "vit-deploy"
    run = subprocess.run([str(cli), "predict", str(result.path), str(image), "--json", "--top-k", "3"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["providers"] == ["cpu"] and len(out["predictions"][0]["top"]) == 3

    from vit_deploy.runtime import ViTSession

    with ViTSession(result.path) as s:
        expected = s.predict([image], top_k=3)[0]
    assert [c["index"] for c in out["predictions"][0]["top"]] == [c.index for c in expected.top]

    example = subprocess.run([str(py), str(ROOT / "examples" / "classify.py"), str(result.path),
                              str(image), "--top-k", "2"], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert example.returncode == 0, example.stderr
    assert "running on CPUExecutionProvider" in example.stdout and str(image) in example.stdout
