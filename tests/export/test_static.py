"""Fixed-shape graphs (export/static.py): the linear layers written as 2-D Gemms for the npu
target compute what the MatMuls did, keep their node names (the map of linear layers) and
leave nothing of the MatMul form behind."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import torch

from vit_deploy.export.static import export_static, op_counts
from vit_deploy.runtime.contract import METADATA_LINEARS_KEY


def _run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {
        "pixel_values": x})[0]


def test_linear_layers_as_gemm_compute_the_same_and_keep_their_names(make_tiny, tmp_path):
    model = make_tiny()
    kw = dict(batch=2, resolution=(32, 48), outputs=("logits",))
    plain = export_static(model, tmp_path / "matmul.onnx", **kw)
    gemm = export_static(model, tmp_path / "gemm.onnx", linear_as_gemm=True, **kw)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 48), dtype=np.float32)
    np.testing.assert_allclose(_run(gemm, x), _run(plain, x), rtol=1e-5, atol=1e-5)
    proto = onnx.load(str(gemm))
    linears = json.loads({p.key: p.value for p in proto.metadata_props}[METADATA_LINEARS_KEY])
    nodes = {n.name: n.op_type for n in proto.graph.node}
    assert len(linears) == 4 * model.cfg.depth + 1  # qkv, proj, fc1, fc2 per block, the head
    assert all(nodes[name] == "Gemm" for name in linears.values()), linears
    before, after = op_counts(plain), op_counts(gemm)
    # the encoder's MatMuls with a weight are gone (attention's two per block remain), and
    # each bias Add folded into its Gemm
    assert after.get("MatMul", 0) == before["MatMul"] - 4 * model.cfg.depth
    assert after["Gemm"] == len(linears)
    assert after["Add"] == before["Add"] - 4 * model.cfg.depth


def test_each_gemm_has_its_own_bias_where_the_exporter_shared_one(make_tiny, tmp_path):
    # Zero biases (a freshly initialised model, as `make export` writes) are one tensor to the
    # exporter, shared by LayerNorms and linear layers; the quantiser would put the bias's
    # int32 DequantizeLinear in front of the LayerNorms too, which HTP refuses (ViT-B/16:
    # 25 nodes on the CPU). Each Gemm reads a bias no other node reads.
    model = make_tiny()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)):
                module.bias.zero_()
    kw = dict(batch=1, resolution=(32, 32), outputs=("logits",))
    plain = onnx.load(str(export_static(model, tmp_path / "matmul.onnx", **kw)))
    readers = _initializer_readers(plain)
    assert any(len(ops) > 1 for ops in readers.values()), readers  # the exporter shared one
    gemm = export_static(model, tmp_path / "gemm.onnx", linear_as_gemm=True, **kw)
    proto = onnx.load(str(gemm))
    readers = _initializer_readers(proto)
    biases = [n.input[2] for n in proto.graph.node if n.op_type == "Gemm" and len(n.input) > 2]
    assert len(biases) == 4 * model.cfg.depth
    assert all(readers[b] == ["Gemm"] for b in biases), {b: readers[b] for b in biases}
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32), dtype=np.float32)
    np.testing.assert_allclose(_run(gemm, x), _run(tmp_path / "matmul.onnx", x),
                               rtol=1e-5, atol=1e-5)


def _initializer_readers(proto):
    names = {i.name for i in proto.graph.initializer}
    readers: dict[str, list[str]] = {}
    for node in proto.graph.node:
        for name in node.input:
            if name in names:
                readers.setdefault(name, []).append(node.op_type)
    return readers
