"""vit_deploy/precisions/fusions.py's attention fusion: every block's attention core becomes one
com.microsoft.MultiHeadAttention in float and int8 graphs with the same outputs, and graphs
whose attention is not the plain pattern (rotary positions, ToMe's size bias) are left alone."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.export.model import build_model
from vit_deploy.precisions.fusions import fuse_attention
from vit_deploy.runtime.config import variant

SIZES = [(32, 32), (24, 40), (64, 48)]


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def _fused_copy(src: Path, tmp_path: Path, heads: int) -> tuple[Path, int]:
    tmp_path.mkdir(exist_ok=True)
    dst = tmp_path / f"fused-{src.name}"
    shutil.copyfile(src, dst)
    return dst, fuse_attention(dst, heads)


def _same_outputs(a: Path, b: Path, atol: float) -> None:
    rng = np.random.default_rng(0)
    for hw in SIZES:
        x = rng.standard_normal((2, 3, *hw)).astype(np.float32)
        ya, yb = _run(a, x), _run(b, x)
        assert np.abs(ya - yb).max() <= atol * max(1.0, np.abs(ya).max()), hw


def test_every_block_of_a_float_graph_is_fused_with_the_same_outputs(tiny_bundle, tmp_path):
    model, result = tiny_bundle
    src = result.path / "model.onnx"
    fused, n = _fused_copy(src, tmp_path, model.cfg.heads)
    assert n == model.cfg.depth
    ops = _ops(fused)
    assert ops["MultiHeadAttention"] == model.cfg.depth and ops["Softmax"] == 0
    assert _ops(src)["Softmax"] == model.cfg.depth  # the bundle's own file untouched
    onnx.checker.check_model(str(fused))
    _same_outputs(src, fused, atol=1e-5)


def test_an_int8_graph_keeps_its_quantised_products_and_its_outputs(quantised_bundle, tmp_path):
    src = quantised_bundle / "model.int8.onnx"  # quantize's default: not fused
    fused, n = _fused_copy(src, tmp_path, variant("tiny").heads)
    assert n == variant("tiny").depth
    before, after = _ops(src), _ops(fused)
    assert after["MatMulInteger"] == before["MatMulInteger"] > 0
    assert after["MultiHeadAttention"] == n and after["Softmax"] == 0
    _same_outputs(src, fused, atol=1e-5)
    again, n = _fused_copy(fused, tmp_path / "again", variant("tiny").heads)
    assert n == 0 and again.read_bytes() == fused.read_bytes()  # nothing left to fuse


@pytest.mark.parametrize("changes", [dict(pos_embed="rope"), dict(merge=(2, 2))],
                         ids=["rope", "tome"])
def test_attention_that_is_not_the_plain_pattern_is_left_alone(changes, tmp_path):
    model = build_model(variant("tiny", **changes), seed=0)
    result = export_bundle(model, tmp_path / "b", options=ExportOptions(resolution=(32, 32),
                                                                         simplify=False))
    src = result.path / "model.onnx"
    fused, n = _fused_copy(src, tmp_path, model.cfg.heads)
    assert n == 0
    assert fused.read_bytes() == src.read_bytes()
