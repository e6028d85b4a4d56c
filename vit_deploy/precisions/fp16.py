"""The fp16 file: the conversion (ORT's float16 converter, float32 kept where it must be),
and the nodes whose tensors come near fp16's range on real photographs, kept float32.

fp16's largest finite value is 65504. A trained ViT's residual stream and MLP activations
grow with depth and image size; a tensor past the range becomes ±inf in an fp16 graph, and
the Cast the converter puts at a float32 / float16 boundary overflows just the same, so a
node is kept float32 when any of its float inputs or outputs reaches 1/HEADROOM of the range
on the photographs measured (other photographs and larger sizes reach further). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from vit_deploy.precisions.probe import tensor_probe

FP16_MAX = 65504.0
HEADROOM = 8.0  # a tensor whose largest |value| passes FP16_MAX / HEADROOM is out of budget
PROBED_IMAGES = 2  # per size, one image at a time (4 cost the trained DINOv2-S 45 s)
CHUNK = 128  # tensors read per run (DINOv2-S at 518x392: an attention map is 25 MB)


def fp16_unsafe_nodes(reference: Path, batches: Sequence[np.ndarray]) -> dict[str, float]:
    """{node name: the largest |value| among its float tensors} of the nodes of the fp32
    graph `reference` whose inputs or outputs pass FP16_MAX / HEADROOM on the first
    PROBED_IMAGES images of each batch (one image at a time: bounded memory)."""
    model = onnx.load(str(reference))
    names = list(dict.fromkeys(o for n in model.graph.node for o in n.output if o))
    peak: dict[str, float] = {}
    for start in range(0, len(names), CHUNK):  # a chunk of tensors held at a time
        probe = tensor_probe(model, names[start:start + CHUNK])
        for x in batches:
            for i in range(min(len(x), PROBED_IMAGES)):
                for name, value in probe(x[i:i + 1]).items():
                    if value.dtype.kind == "f" and value.size:
                        peak[name] = max(peak.get(name, 0.0), float(np.abs(value).max()))
    large = {t for t, p in peak.items() if p > FP16_MAX / HEADROOM}
    unsafe = {}
    for node in model.graph.node:
        touched = [peak[t] for t in (*node.input, *node.output) if t in large]
        if touched:
            unsafe[node.name] = round(max(touched), 1)
    return unsafe


def fp16_file(model: onnx.ModelProto, dst: Path, keep_ops: Sequence[str],
              keep_nodes: Sequence[str]) -> None:
    """`model` in float16 (float32 inputs and outputs) written to `dst`: the op types
    `keep_ops` (beside ORT's own block list) and the nodes `keep_nodes` stay float32."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    block = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(keep_ops))
    converted = convert_float_to_float16(model, keep_io_types=True, op_block_list=block,
                                         node_block_list=list(keep_nodes),
                                         disable_shape_infer=False)
    _drop_repeated_nodes(converted)
    _skip_round_trips(converted)
    OnnxModel(converted).topological_sort()  # the converter appends its input casts at the end
    onnx.save(converted, str(dst))


def _skip_round_trips(model: onnx.ModelProto) -> None:
    """Float32 from one kept-float32 node to the next directly. The converter casts each
    kept node's outputs to float16 and its inputs back to float32, so between two kept
    nodes a tensor passed through float16 all the same: a value past 65504 became inf there
    (fc1 -> GELU of a model whose MLP activations pass fp16's range: NaN logits). A Cast to
    float32 of a Cast to float16 of a float32 tensor reads that tensor instead; casts left
    with no reader go."""
    nodes = {o: n for n in model.graph.node for o in n.output}
    to = {n.name: next((a.i for a in n.attribute if a.name == "to"), None)
          for n in model.graph.node if n.op_type == "Cast"}
    FLOAT, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    rename = {}
    for n in model.graph.node:
        if n.op_type == "Cast" and to.get(n.name) == FLOAT and n.input[0] in nodes:
            first = nodes[n.input[0]]
            if first.op_type == "Cast" and to.get(first.name) == FLOAT16 \
                    and first.input[0] in nodes and nodes[first.input[0]].op_type != "Cast":
                rename[n.output[0]] = first.input[0]
    if not rename:
        return
    for n in model.graph.node:
        n.input[:] = [rename.get(i, i) for i in n.input]
    outputs = {o.name for o in model.graph.output}
    while True:  # casts that nothing reads any more
        read = {i for n in model.graph.node for i in n.input} | outputs
        dead = [n for n in model.graph.node if n.op_type == "Cast"
                and not any(o in read for o in n.output)]
        if not dead:
            return
        for n in dead:
            model.graph.node.remove(n)


def _drop_repeated_nodes(model: onnx.ModelProto) -> None:
    """Keep one of each node the fp16 converter wrote twice. It casts a kept-fp32 op's
    float16 input once per consumer, under one name: an initializer that the exporter shared
    between LayerNorms (identical zero biases of a fresh model, unsimplified) became two
    `NAME_cast_to_fp32` Casts, which breaks single assignment. Same op, inputs, outputs
    and attributes: the same value, so one serves."""
    seen: set[tuple] = set()
    keep = []
    for node in model.graph.node:
        key = (node.op_type, node.domain, tuple(node.input), tuple(node.output),
               tuple(a.SerializeToString(deterministic=True) for a in node.attribute))
        if key in seen:
            continue
        seen.add(key)
        keep.append(node)
    if len(keep) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(keep)
