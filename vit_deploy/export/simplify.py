"""onnxsim on a dynamic export, keeping the dims symbolic and the metadata."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxsim

from vit_deploy.runtime.files import write_bytes_atomic
from vit_deploy.runtime.contract import IR_VERSION
from vit_deploy.export.onnx import ExportError, validate_onnx


def simplify_onnx(src: str | Path, dst: str | Path) -> Path:
    """Simplify `src` into `dst`. Raises ExportError if onnxsim fails or drops a symbolic dim.

    Whether the result is *kept* is the caller's decision (parity, node count).
    """
    model = onnx.load(str(src))
    try:
        simplified, ok = onnxsim.simplify(model)
    except Exception as e:
        raise ExportError(f"onnxsim failed: {e}") from e
    if not ok:
        raise ExportError("onnxsim's own check of the simplified model failed")
    before, after = _dims(model), _dims(simplified)
    if before != after:
        raise ExportError(f"onnxsim changed the graph's input/output dims {before} -> {after}")
    simplified.ir_version = IR_VERSION
    del simplified.metadata_props[:]
    simplified.metadata_props.extend(model.metadata_props)
    simplified.producer_name = model.producer_name
    return write_bytes_atomic(dst, validate_onnx(simplified))


def _dims(model: onnx.ModelProto) -> list[list[str | int]]:
    return [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.input, *model.graph.output]]
