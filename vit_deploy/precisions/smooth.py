"""SmoothQuant-style scale migration, folded into the graph before int8 quantisation.

Trained ViTs have a few activation channels far larger than the rest at the output of
LayerNorm: one per-tensor int8 scale then spends its 256 levels on those channels and
rounds the others away. For a LayerNorm feeding linear layers, y = LN(x) @ W, a per-channel
factor s moves that difficulty into the weights (which are quantised per output channel):

    y = (LN(x) / s) @ (diag(s) @ W),   s_j = max|X_j|^alpha / max_k |W_jk|^(1 - alpha)

LN(x) / s is the same LayerNorm with scale gamma / s and bias beta / s, so the fold costs
nothing at run time: the graph keeps its nodes, only initialisers change, and in float the
model computes the same function (rounding aside). The pairs are LayerNorm -> qkv and
LayerNorm -> fc1 of every block; fc2 and proj follow GELU / attention, which no scale
passes through. Xiao et al., "SmoothQuant" (2023), section 4; alpha is chosen on real
images by the caller (add.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from vit_deploy.precisions.calibrate import Memo, _key



@dataclass(frozen=True)
class SmoothPair:
    """One LayerNorm and the linear layers (MatMul with a constant weight) it alone feeds."""

    norm: str  # LayerNormalization node name
    activation: str  # its output tensor
    linears: tuple[str, ...]  # MatMul node names


def smoothable(model: onnx.ModelProto, linears: Sequence[str]) -> list[SmoothPair]:
    """The LayerNorms whose output feeds only `linears` (node names), each as MatMul(x, W)
    with W a 2-D initialiser, and whose scale and bias are initialisers."""
    inits = {i.name: i for i in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}
    wanted = set(linears)
    pairs = []
    for node in model.graph.node:
        if node.op_type != "LayerNormalization" or len(node.input) < 3:
            continue
        if node.input[1] not in inits or node.input[2] not in inits:
            continue
        out = node.output[0]
        users = consumers.get(out, [])
        if not users or out in graph_outputs or any(
                u.op_type != "MatMul" or u.name not in wanted or u.input[0] != out
                or u.input[1] not in inits or len(inits[u.input[1]].dims) != 2 for u in users):
            continue
        pairs.append(SmoothPair(node.name, out, tuple(u.name for u in users)))
    return pairs


def channel_absmax(model: onnx.ModelProto, pairs: Sequence[SmoothPair],
                   batches: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """max |x| per channel (last axis) of each pair's LayerNorm output over `batches`,
    streamed image by image (calibrate.py: one image's activations in memory at a time)."""
    from vit_deploy.precisions.calibrate import stream

    absmax: dict[str, np.ndarray] = {}

    def add(_outputs: dict[str, np.ndarray], tensors: dict[str, np.ndarray]) -> None:
        for name, value in tensors.items():
            m = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            absmax[name] = np.maximum(absmax[name], m) if name in absmax else m

    stream(model, [p.activation for p in pairs], batches, add)
    return absmax


def fold(model: onnx.ModelProto, pairs: Sequence[SmoothPair], absmax: dict[str, np.ndarray],
         alpha: float) -> int:
    """Fold the smoothing factors for `alpha` into `model` (in place); returns how many
    LayerNorms were smoothed. Initialisers shared with other nodes are copied, never
    changed under another node."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smoothing alpha must be within [0, 1], got {alpha!r}")
    inits = {i.name: i for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    done = 0
    for pair in pairs:
        norm = nodes[pair.norm]
        weights = [numpy_helper.to_array(inits[nodes[m].input[1]]) for m in pair.linears]
        x_max = absmax[pair.activation].astype(np.float64)
        w_max = np.max([np.abs(w).max(axis=1) for w in weights], axis=0).astype(np.float64)
        if x_max.shape != w_max.shape:
            raise ValueError(f"{pair.norm}: {x_max.shape[0]} channels but weights of "
                             f"{w_max.shape[0]} input rows")
        s = np.power(np.maximum(x_max, 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5),
                                                                 1.0 - alpha)
        s = np.where((x_max > 0) & (w_max > 0), np.clip(s, 1e-3, 1e3), 1.0)
        for slot, scale in ((1, 1.0 / s), (2, 1.0 / s)):  # gamma / s, beta / s
            value = numpy_helper.to_array(inits[norm.input[slot]]).astype(np.float64) * scale
            norm.input[slot] = _own(model, inits, f"{pair.norm}.smoothed.{slot}",
                                    value.astype(np.float32))
        for m, w in zip(pair.linears, weights):
            node = nodes[m]
            node.input[1] = _own(model, inits, f"{m}.smoothed.weight",
                                 (w.astype(np.float64) * s[:, None]).astype(np.float32))
        done += 1
    _drop_unused(model)
    return done


def _own(model: onnx.ModelProto, inits: dict[str, onnx.TensorProto], name: str,
         value: np.ndarray) -> str:
    tensor = numpy_helper.from_array(value, name)
    model.graph.initializer.append(tensor)
    inits[name] = tensor
    return name


def _drop_unused(model: onnx.ModelProto) -> None:
    used = {name for node in model.graph.node for name in node.input}
    keep = [i for i in model.graph.initializer if i.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def smooth_model(src: Path | onnx.ModelProto, linears: Sequence[str],
                 batches: Sequence[np.ndarray], alpha: float) -> tuple[onnx.ModelProto, int]:
    """A copy of the model with every LayerNorm -> linear pair smoothed for `alpha`."""
    model = onnx.load(str(src)) if not isinstance(src, onnx.ModelProto) else src
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pairs = smoothable(out, linears)
    if not pairs:
        return out, 0
    return out, fold(out, pairs, _statistics(out, pairs, batches), alpha)


_channel_stats = Memo()


def _statistics(model: onnx.ModelProto, pairs: Sequence[SmoothPair],
                batches: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """channel_absmax, remembered (calibrate.Memo): choosing alpha quantises the same model
    on the same images once per candidate and once more for the file, and the statistics
    do not depend on alpha."""
    return _channel_stats.get(_key(model, batches, tuple((p.norm, p.linears) for p in pairs)),
                              lambda: channel_absmax(model, pairs, batches))
