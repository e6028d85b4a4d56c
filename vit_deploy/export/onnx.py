"""PyTorch ViT -> ONNX with torch.onnx.export(dynamo=True): dynamic batch and patch grid."""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch

from vit_deploy.runtime.files import write_bytes_atomic
from vit_deploy.runtime.errors import FAILED, VitDeployError
from vit_deploy.runtime.contract import (BATCH_DIM, GRID_H_DIM, GRID_W_DIM, HEIGHT_DIM, INPUT_NAME,
                                 IR_VERSION, METADATA_CONFIG_KEY, METADATA_LINEARS_KEY, OPSET,
                                 PRODUCER, WIDTH_DIM)
from vit_deploy.export.model import ViT, ViTOutputs
from vit_deploy.outputs import OutputSelection, is_grid_output, select_outputs

# Trace on a non-square grid that is nobody's native grid, with batch 2, so nothing
# specialises on a size (docs/getting-started.md: one graph, any patch grid).
TRACE_GRID = (13, 17)
TRACE_BATCH = 2


class ExportError(VitDeployError, RuntimeError):
    """torch.onnx.export or the ONNX checks failed."""

    exit_code = FAILED


@dataclass(frozen=True, kw_only=True)
class OnnxOptions:
    opset: int = OPSET
    static_resolution: tuple[int, int] | None = None  # freeze one (H, W): no Resize in the graph
    features: bool = False  # also output the pooled features (B, D)
    outputs: OutputSelection | None = None  # None: the model's defaults (outputs.py)


def export_onnx(model: ViT, dst: str | Path, *, options: OnnxOptions = OnnxOptions()) -> Path:
    """Export `model` to `dst` (written atomically); returns `dst`.

    Dynamic: input (batch, C, height, width) with height = P·gh, width = P·gw.
    Static: one (H, W), the position table folded to a constant.
    """
    if options.opset < 18:
        raise ValueError(f"opset must be >= 18 (Resize with antialias), got {options.opset}")
    cfg = model.cfg
    P = cfg.patch_size
    model = model.eval()
    if options.static_resolution is not None:
        model = model.frozen_at(*options.static_resolution)
        example = torch.randn(TRACE_BATCH, cfg.in_chans, *options.static_resolution)
        dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=1)}}
    else:
        example = torch.randn(TRACE_BATCH, cfg.in_chans, P * TRACE_GRID[0], P * TRACE_GRID[1])
        gh, gw = torch.export.Dim("gh", min=1), torch.export.Dim("gw", min=1)
        dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=1), 2: P * gh, 3: P * gw}}
    selection = options.outputs or select_outputs(cfg, features=options.features)
    # The classic one-output graph is the model itself; anything else goes through the
    # wrapper, whose module paths are the same under "vit." (linear_nodes_from_scopes).
    module: torch.nn.Module = (model if selection.default_only else
                               ViTOutputs(model, selection.names, layer_norm=selection.layer_norm))
    proto = trace(module, example, output_names=list(selection.names),
                  dynamic_shapes=dynamic_shapes, opset=options.opset,
                  what=cfg.name or "model")
    finalize(proto, config_json=cfg.to_json())
    _name_grid_dims(proto)
    return write_bytes_atomic(dst, validate_onnx(proto))


def trace(module: torch.nn.Module, example: torch.Tensor, *, output_names: list[str],
          dynamic_shapes: dict | None, opset: int, what: str) -> onnx.ModelProto:
    """torch.onnx.export(dynamo=True) of `module` on `example`: the graph, before our
    finishing (names, metadata, checks). The one place the exporter runs."""
    try:
        with _quiet(), torch.no_grad():
            program = torch.onnx.export(
                module, (example,), dynamo=True, input_names=[INPUT_NAME],
                output_names=output_names, dynamic_shapes=dynamic_shapes,
                opset_version=opset, verbose=False, optimize=True)
    except Exception as e:  # the exporter raises many types; keep the message, drop the noise
        raise ExportError(f"torch.onnx.export failed for {what}: {e}") from e
    return program.model_proto


def finalize(proto: onnx.ModelProto, *, config_json: str, renames: dict[str, str] | None = None,
             metadata: dict[str, str] | None = None) -> None:
    """Name the dynamic dims, pin the IR version, and store the config (and the linear
    layers' node names, and `metadata`) in the metadata. `renames`: the exporter's dim
    names -> ours (default: an image input's batch, height and width)."""
    if renames is None:
        inp = proto.graph.input[0].type.tensor_type.shape.dim
        renames = {inp[0].dim_param: BATCH_DIM, inp[2].dim_param: HEIGHT_DIM,
                   inp[3].dim_param: WIDTH_DIM}
    renames = {k: v for k, v in renames.items() if k}
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]
    proto.ir_version = IR_VERSION
    proto.producer_name = PRODUCER
    set_metadata(proto, {METADATA_CONFIG_KEY: config_json,
                         METADATA_LINEARS_KEY: json.dumps(linear_nodes_from_scopes(proto)),
                         **(metadata or {})})
    strip_node_metadata(proto)


def strip_node_metadata(proto: onnx.ModelProto) -> None:
    """Drop what the exporter records on each node (name scopes, FX nodes, the Python stack
    trace with this machine's absolute paths) and the doc strings: read once, by
    linear_nodes_from_scopes, and never again; a published bundle carries no local path
    (about half of a small model's bytes)."""
    proto.graph.doc_string = ""
    for node in proto.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""


def _name_grid_dims(proto: onnx.ModelProto) -> None:
    """Dense outputs (B, D, gh, gw): their symbolic grid dims get the contract's names."""
    for value in proto.graph.output:
        dims = value.type.tensor_type.shape.dim
        if is_grid_output(value.name) and len(dims) == 4:
            for dim, name in ((dims[2], GRID_H_DIM), (dims[3], GRID_W_DIM)):
                if dim.dim_param or not dim.HasField("dim_value"):
                    dim.dim_param = name


def linear_nodes_from_scopes(proto: onnx.ModelProto) -> dict[str, str]:
    """{module path: ONNX node name} of the MatMul/Gemm computing each nn.Linear, read from
    the name scopes the dynamo exporter records on every node. Node names survive onnxsim
    (the metadata does not), so the map is stored in the model's metadata."""
    out: dict[str, str] = {}
    for node in proto.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        meta = {p.key: p.value for p in node.metadata_props}
        if "torch.nn.modules.linear.Linear" not in meta.get("pkg.torch.onnx.class_hierarchy", ""):
            continue
        try:
            scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "[]"))
        except (ValueError, SyntaxError):
            continue
        path = scopes[-2] if len(scopes) >= 2 else ""
        path = path.removeprefix("vit.")  # the same layer under an export wrapper
        if path and path not in out:
            out[path] = node.name
    return out


def set_metadata(proto: onnx.ModelProto, props: dict[str, str]) -> None:
    kept = [p for p in proto.metadata_props if p.key not in props]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in props.items():
        proto.metadata_props.add(key=key, value=value)


def validate_onnx(proto: onnx.ModelProto) -> bytes:
    """onnx checker and strict shape inference must pass on every model we write; returns
    the bytes they checked, which the caller writes (ViT-B/16 is 346 MB to serialise: once,
    not three times)."""
    data = proto.SerializeToString()
    try:
        onnx.checker.check_model(data)
        onnx.shape_inference.infer_shapes(data, check_type=True, strict_mode=True)
    except Exception as e:
        raise ExportError(f"exported model fails the ONNX checks: {e}") from e
    return data


def node_count(proto_or_path: onnx.ModelProto | str | Path) -> int:
    proto = proto_or_path if isinstance(proto_or_path, onnx.ModelProto) else onnx.load(
        str(proto_or_path), load_external_data=False)
    return len(proto.graph.node)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter logs and warns about things that do not concern our users."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo",
                                              "torch.fx.experimental.symbolic_shapes", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
