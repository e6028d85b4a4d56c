"""Fixed-shape graphs (export/static.py): the linear layers written as 2-D Gemms for the npu
target compute what the MatMuls did, keep their node names (the map of linear layers) and
leave nothing of the MatMul form behind."""

import json

import numpy as np
import onnx
import onnxruntime as ort

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
