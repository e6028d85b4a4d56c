"""Per-channel weight scales for ONNX Runtime's dynamic int8, found for a whole tensor at once.

ORT's quantiser finds each output channel's scale in a Python loop: about 250,000 calls on
DINOv2-S, half of the 2.1 s its quantize_dynamic took there (1.0 s with the scales given;
2-core AMD EPYC, 2026-12-07), and the recipe search quantises a model up to 14 times (12
candidates, the ranking, the file). It also takes the scales as given (its
documented TensorQuantOverrides option) and then only rounds. The scales here are its own
formula for symmetric int8 weights (zero point 0; the channel's range widened to hold 0,
made symmetric, over ORT's integer range for the weight type and `reduce_range`, in float64
then float32; 1.0 for a channel of zeros), so the file holds the same bytes as without them
(tests/precisions/test_weights.py). Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper


def per_channel_overrides(model: onnx.ModelProto, nodes: Iterable[str], *,
                          reduce_range: bool) -> dict[str, list[dict[str, Any]]]:
    """{weight name: one {axis, scale, zero_point} per output channel} for the MatMul nodes
    of `nodes` whose weight is a 2-D float32 initialiser (what ORT quantises per channel
    along axis 1); other nodes, and weights that are not finite, are left to ORT's own loop."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(onnx.TensorProto.INT8, reduce_range=reduce_range,
                                         symmetric=True)
    steps = float(qmax) - float(qmin)
    inits = {i.name: i for i in model.graph.initializer}
    wanted = set(nodes)
    overrides: dict[str, list[dict[str, Any]]] = {}
    for node in model.graph.node:
        if (node.name not in wanted or node.op_type != "MatMul" or len(node.input) < 2
                or node.input[1] not in inits or node.input[1] in overrides):
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        if w.ndim != 2 or w.dtype != np.float32 or not w.size:
            continue
        absmax = np.maximum(np.abs(np.minimum(w.min(axis=0), 0)),
                            np.abs(np.maximum(w.max(axis=0), 0)))  # float32, as ORT's
        if not np.isfinite(absmax).all():
            continue  # a NaN or inf weight (a damaged file): ORT's own checks meet it
        scale = 2.0 * absmax.astype(np.float64) / steps
        scale = np.where(scale < np.finfo(np.float32).tiny, 1.0, scale).astype(np.float32)
        overrides[node.input[1]] = [{"axis": 1, "scale": s, "zero_point": np.int8(0)}
                                    for s in scale]
    return overrides
