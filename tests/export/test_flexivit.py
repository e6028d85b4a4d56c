"""Patch size at export (FlexiViT): the pseudo-inverse resize of the patch embedding,
against an independent numpy implementation, and through the export."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.runtime.config import variant
from vit_deploy.export.checkpoints import save_weights
from vit_deploy.export.model import build_model
from vit_deploy.export.patch_resample import pi_resize_matrix, resample_patch_embed


def _bilinear_matrix(old: int, new: int) -> np.ndarray:
    """1-D linear interpolation (align_corners=False, edge-clamped), written out by hand:
    (new, old)."""
    m = np.zeros((new, old))
    for i in range(new):
        src = max((i + 0.5) * old / new - 0.5, 0.0)
        lo = min(int(np.floor(src)), old - 1)
        hi = min(lo + 1, old - 1)
        frac = src - lo
        m[i, lo] += 1 - frac
        m[i, hi] += frac
    return m


def _numpy_pi_resize(kernel: np.ndarray, new: int) -> np.ndarray:
    """FlexiViT's PI-resize with numpy only: B = the 2-D bilinear resize as a matrix
    (kron of the 1-D ones), w' = pinv(Bᵀ) w for every (out, in) channel pair."""
    D, C, p, _ = kernel.shape
    one_d = _bilinear_matrix(p, new)
    B = np.kron(one_d, one_d)  # (new², p²), row-major flattening
    return (kernel.reshape(D * C, p * p) @ np.linalg.pinv(B.T).T).reshape(D, C, new, new)


@pytest.mark.parametrize("old,new", [(8, 16), (8, 12), (16, 8), (4, 6)])
def test_pi_resize_matches_an_independent_numpy_implementation(old, new):
    rng = np.random.default_rng(old * new)
    kernel = rng.standard_normal((5, 3, old, old))
    ours = resample_patch_embed(torch.from_numpy(kernel), (new, new), mode="bilinear",
                                antialias=False).numpy()
    np.testing.assert_allclose(ours, _numpy_pi_resize(kernel, new), rtol=0, atol=1e-10)


@pytest.mark.parametrize("old,new", [(8, 16), (8, 24), (6, 14)])
def test_a_grown_kernel_sees_a_resized_patch_as_the_old_kernel_saw_the_patch(old, new):
    """The defining property (FlexiViT eq. 4): <B x, PI-resize(w)> = <x, w>, bicubic with
    antialias as timm resamples by default."""
    rng = np.random.default_rng(new)
    kernel = torch.from_numpy(rng.standard_normal((4, 3, old, old)))
    patches = torch.from_numpy(rng.standard_normal((7, 3, old, old)))
    grown = resample_patch_embed(kernel, (new, new))
    B = pi_resize_matrix((old, old), (new, new))
    resized = (patches.reshape(21, old * old) @ B.T).reshape(7, 3, new, new)
    before = torch.einsum("nchw,dchw->nd", patches, kernel)
    after = torch.einsum("nchw,dchw->nd", resized, grown)
    torch.testing.assert_close(after, before, rtol=1e-9, atol=1e-9)
    # shrinking is a least-squares fit, not exact: the property fails there
    shrunk = resample_patch_embed(kernel, (old // 2, old // 2))
    small = (patches.reshape(21, -1) @ pi_resize_matrix((old, old), (old // 2,) * 2).T)
    gap = torch.einsum("nchw,dchw->nd", small.reshape(7, 3, old // 2, old // 2), shrunk) - before
    assert gap.abs().max() > 1e-3


@pytest.mark.parametrize("pos_embed", ["learned", "factorized"])
def test_a_model_at_another_patch_size(pos_embed):
    cfg = variant("S/8", depth=2, width=32, heads=2, img_size=(32, 48), num_classes=3,
                  pos_embed=pos_embed)
    model = build_model(cfg, seed=0)
    flexed = model.with_patch_size(16)
    assert flexed.cfg.patch_size == 16 and flexed.cfg.trained_patch_size == 8
    assert flexed.cfg.img_size == (32, 48) and flexed.cfg.grid_size == (2, 3)
    x = torch.randn(2, 3, 32, 48)  # the native grid of both: each table resampled once
    with torch.no_grad():
        # the deployed model is the trained one run at patch 16 (FlexiViT's forward)
        torch.testing.assert_close(flexed(x), model(x, patch=16), rtol=1e-4, atol=1e-5)
    assert flexed.with_patch_size(16) is flexed
    assert flexed.with_patch_size(8).cfg.trained_patch_size == 8  # the original, not 16


def test_export_at_another_patch_size_records_both(tmp_path):
    cfg = variant("S/8", depth=2, width=32, heads=2, img_size=(32, 32), num_classes=3,
                  name="tiny-flex")
    ckpt = save_weights(build_model(cfg, seed=1), tmp_path / "w.safetensors")
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(ckpt), "--patch", "16",
                                  "--res", "64", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["patch_size"] == 16
    assert manifest["config"]["trained_patch_size"] == 8
    assert manifest["io"]["patch_size"] == 16 and manifest["parity"]["passed"]
    info = CliRunner().invoke(main, ["info", str(out)])
    assert "PI-resized from 8" in info.output
