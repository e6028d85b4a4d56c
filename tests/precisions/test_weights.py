"""precisions/weights.py: the per-channel weight scales handed to ONNX Runtime's dynamic int8
give the file its own loop would write, byte for byte, and quantize uses them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vit_deploy.precisions import weights
from vit_deploy.precisions.quantize import QuantOptions, _int8_dynamic, quantize_model
from vit_deploy.runtime.contract import MODEL_FILE


def _graph() -> onnx.ModelProto:
    """Two MatMuls on 2-D float32 weights whose channels are the edge cases of the formula:
    all zeros (scale 1.0), only negative, only positive, subnormal (a scale under float32's
    tiny), one large value among small ones; and a MatMul left out of the nodes."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    w[:, 0] = 0.0
    w[:, 1] = -np.abs(w[:, 1])
    w[:, 2] = np.abs(w[:, 2])
    w[:, 3] = 1e-41
    w[5, 4] = 300.0
    v = (rng.standard_normal((8, 4)) * 0.02).astype(np.float32)
    u = rng.standard_normal((4, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="first"),
             helper.make_node("MatMul", ["h", "v"], ["g"], name="second"),
             helper.make_node("MatMul", ["g", "u"], ["y"], name="left_out")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v"),
         numpy_helper.from_array(u, "u")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("reduce_range", [False, True], ids=["8-bit", "7-bit"])
def test_the_scales_give_the_bytes_of_onnx_runtimes_own_loop(tmp_path, reduce_range,
                                                            monkeypatch):
    model = _graph()
    src = tmp_path / "in.onnx"
    onnx.save(model, str(src))
    options = QuantOptions(cpu="any" if reduce_range else "vnni")
    assert options.reduce_range is reduce_range and options.per_channel
    given = weights.per_channel_overrides(model, ["first", "second"], reduce_range=reduce_range)
    assert set(given) == {"w", "v"} and len(given["w"]) == 8 and given["w"][0]["scale"] == 1.0
    assert given["w"][3]["scale"] == 1.0  # 1e-41: under float32's tiny, as ORT's rule
    _int8_dynamic(src, tmp_path / "ours.onnx", model, ["first", "second"], options)
    monkeypatch.setattr(weights, "per_channel_overrides", lambda *a, **k: {})
    _int8_dynamic(src, tmp_path / "theirs.onnx", model, ["first", "second"], options)
    ours, theirs = (tmp_path / "ours.onnx").read_bytes(), (tmp_path / "theirs.onnx").read_bytes()
    assert ours == theirs
    quantised = {i.name for i in onnx.load_from_string(ours).graph.initializer}
    assert {"w_quantized", "v_quantized"} <= quantised and "u_quantized" not in quantised


def test_quantize_hands_the_scales_to_onnx_runtime(tiny_bundle, tmp_path, monkeypatch):
    """int8 of a bundle's model: the scales are computed here once per weight (not by ORT's
    loop) and the file is the same as without them."""
    asked = []
    real = weights.per_channel_overrides

    def spy(model, nodes, *, reduce_range):
        found = real(model, nodes, reduce_range=reduce_range)
        asked.append(sorted(found))
        return found

    src = tiny_bundle[1].path / MODEL_FILE
    monkeypatch.setattr(weights, "per_channel_overrides", spy)
    quantize_model(src, tmp_path / "ours.onnx", precision="int8")
    # the tiny model's 8 block linears and its head (a Gemm made MatMul for ORT)
    assert len(asked) == 1 and len(asked[0]) == 9 and "head.weight_matmul" in asked[0]
    monkeypatch.setattr(weights, "per_channel_overrides", lambda *a, **k: {})
    quantize_model(src, tmp_path / "theirs.onnx", precision="int8")
    assert (tmp_path / "ours.onnx").read_bytes() == (tmp_path / "theirs.onnx").read_bytes()


def test_a_weight_that_is_not_finite_is_left_to_onnx_runtimes_own_checks():
    model = _graph()
    v = model.graph.initializer[1]
    broken = numpy_helper.to_array(v).copy()
    broken[0, 2] = np.nan
    v.CopyFrom(numpy_helper.from_array(broken, "v"))
    assert set(weights.per_channel_overrides(model, ["first", "second"],
                                             reduce_range=False)) == {"w"}
