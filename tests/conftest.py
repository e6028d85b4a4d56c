"""Fixtures shared by the tests. Tests ask for these by name (pytest injects them); nothing
here is imported as a module."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from vit_deploy.runtime.config import variant
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.export.model import ViT, build_model

# The tiny model: width 48, depth 2, heads 3, patch 8, native 32x32 (a 4x4 grid).
TINY_KINDS = [("learned", "cls"), ("factorized", "mean")]


@pytest.fixture(autouse=True)
def _torch_threads():
    torch.set_num_threads(2)


def _tiny(pos_embed: str = "learned", pool: str = "cls", **kw) -> ViT:
    return build_model(variant("tiny", pos_embed=pos_embed, pool=pool, **kw), seed=0)


def _torch_logits(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


@pytest.fixture(scope="session")
def make_tiny() -> Callable[..., ViT]:
    """make_tiny(pos_embed="learned", pool="cls", **config overrides) -> a tiny ViT, seed 0
    (the same weights on every call)."""
    return _tiny


@pytest.fixture(scope="session")
def torch_logits() -> Callable[[torch.nn.Module, np.ndarray], np.ndarray]:
    """torch_logits(model, x) -> the model's logits for the float32 batch x, as numpy."""
    return _torch_logits


@pytest.fixture(scope="session", params=TINY_KINDS, ids=lambda p: f"{p[0]}-{p[1]}")
def tiny_bundle(request, tmp_path_factory):
    """A tiny model and its exported dynamic bundle (one export per kind per session)."""
    pos_embed, pool = request.param
    model = _tiny(pos_embed, pool)
    out = tmp_path_factory.mktemp("bundles") / f"tiny-{pos_embed}-{pool}"
    result = export_bundle(model, out, options=ExportOptions(resolution=(48, 64)))
    return model, result


@pytest.fixture(scope="session")
def quantised_bundle(tmp_path_factory):
    """A tiny bundle (deploy 24x40) with int8 (dynamic) and int4 models; treat as read-only."""
    from vit_deploy.precisions import add_precisions

    out = tmp_path_factory.mktemp("quantised") / "b"
    export_bundle(_tiny(), out, options=ExportOptions(resolution=(24, 40), simplify=False))
    add_precisions(out, ["int8", "int4"])
    return out


# `make test-fast` (the edit loop, under 90 s on 2 cores) leaves out the files that start
# servers, browsers, emulators or fresh virtual environments, kill processes, or export
# many models; `make test` runs everything. A test elsewhere can opt out with
# @pytest.mark.heavy.
HEAVY_FILES = {
    "test_reliability.py", "test_readme.py", "test_bundle.py", "test_web.py",
    "test_web_package.py", "test_dense.py", "test_onnx.py", "test_checkpoints.py",
    "test_families.py", "test_hub.py", "test_targets.py", "test_benchmarks.py", "test_sweep.py",
    "test_ownership.py", "test_tome.py", "test_flexivit.py", "test_tensorrt.py", "test_fuzz.py",
    "test_server_hostile.py", "test_server.py", "test_server_v2.py", "test_triton.py",
    "test_digits.py", "test_install.py", "test_recovery.py", "test_bench.py",
    "test_references.py", "test_arm64.py",
}


# The longest files first (seconds in one quiet `make test`, 2026-12-01): `make test` hands
# whole files to two workers, which then finish closer together than when a one-minute file
# starts last.
LONGEST_FIRST = ["test_install.py",  # 82: the wheel in fresh venvs, every platform resolved
                 "test_readme.py",  # 54: the README's ViT-B/16 export
                 "test_web.py", "test_reliability.py", "test_checkpoints.py",  # 45, 39, 36
                 "test_server_hostile.py", "test_int8_cpu.py", "test_bundle.py",  # 29, 28, 27
                 "test_ownership.py", "test_recovery.py", "test_sweep.py", "test_tome.py",
                 "test_dense.py", "test_families.py"]  # 26 .. 19


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in HEAVY_FILES:
            item.add_marker(pytest.mark.heavy)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file
