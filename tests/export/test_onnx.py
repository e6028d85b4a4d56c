import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import INPUT_NAME, IR_VERSION, LOGITS_NAME, METADATA_CONFIG_KEY, MODEL_FILE
from vit_deploy.export.onnx import OnnxOptions, export_onnx
from vit_deploy.parity import judge, sample_inputs


def _dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_dynamic_dims_are_named_and_config_is_in_metadata(tiny_bundle):
    model, result = tiny_bundle
    proto = onnx.load(str(result.path / MODEL_FILE))
    assert proto.ir_version == IR_VERSION
    assert [i.name for i in proto.graph.input] == [INPUT_NAME]
    assert _dims(proto.graph.input[0]) == ["batch", 3, "height", "width"]
    assert _dims(proto.graph.output[0]) == ["batch", 10]
    meta = {p.key: p.value for p in proto.metadata_props}
    stored = json.loads(meta[METADATA_CONFIG_KEY])
    # the tiny model's known shape, then a round trip back to the model's own config
    assert (stored["width"], stored["depth"], stored["heads"], stored["patch_size"],
            stored["img_size"], stored["num_classes"]) == (48, 2, 3, 8, [32, 32], 10)
    assert (stored["pos_embed"], stored["pool"]) == (model.cfg.pos_embed, model.cfg.pool)
    assert ViTConfig.from_dict(stored) == model.cfg
    onnx.checker.check_model(proto)
    onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    ops = {n.op_type for n in proto.graph.node}
    # the position table is resampled in the graph: two small products with the 1-D weights
    # of F.interpolate, read off a Resize of the basis (ORT's CPU Resize of the whole table
    # over all D channels was slow)
    assert "Einsum" in ops and "Resize" in ops


# Grids the export never saw: square, non-square, 1x1, odd, larger than native.
@pytest.mark.parametrize("hw", [(32, 32), (8, 8), (24, 40), (56, 72), (8, 128), (96, 96)])
@pytest.mark.parametrize("batch", [1, 3])
def test_onnx_matches_pytorch_at_any_grid(tiny_bundle, torch_logits, hw, batch):
    model, result = tiny_bundle
    session = ort.InferenceSession(str(result.path / MODEL_FILE), providers=["CPUExecutionProvider"])
    x = sample_inputs(hw, batch, seed=7)
    out = session.run([LOGITS_NAME], {INPUT_NAME: x})[0]
    case = judge(torch_logits(model, x), out, resolution=hw, provider="cpu")
    assert case.passed, case


def test_static_export_has_no_resize_and_fixed_size(tmp_path, make_tiny, torch_logits):
    model = make_tiny()
    path = export_onnx(model, tmp_path / "static.onnx",
                       options=OnnxOptions(static_resolution=(24, 40)))
    proto = onnx.load(str(path))
    assert "Resize" not in {n.op_type for n in proto.graph.node}
    assert _dims(proto.graph.input[0]) == ["batch", 3, 24, 40]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = sample_inputs((24, 40), 2)
    assert judge(torch_logits(model, x), session.run(None, {INPUT_NAME: x})[0],
                 resolution=(24, 40), provider="cpu").passed
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        session.run(None, {INPUT_NAME: sample_inputs((32, 32), 1)})


def test_features_output(tmp_path, make_tiny, torch_logits):
    model = make_tiny("factorized", "mean")
    path = export_onnx(model, tmp_path / "f.onnx", options=OnnxOptions(features=True))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits", "pooled"]
    x = sample_inputs((16, 24), 2)
    logits, pooled = session.run(None, {INPUT_NAME: x})
    assert pooled.shape == (2, model.cfg.width)
    np.testing.assert_allclose(logits, torch_logits(model, x), atol=1e-5)


def test_opset_below_18_is_refused(tmp_path, make_tiny):
    with pytest.raises(ValueError, match="opset must be >= 18"):
        export_onnx(make_tiny(), tmp_path / "x.onnx", options=OnnxOptions(opset=17))
    assert not any(tmp_path.iterdir())
