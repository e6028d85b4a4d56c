"""Fixed-shape graphs for edge targets: one (batch, H, W) per file, no Resize, no Shape.

`export_static(model, dst, batch=1, resolution=(H, W))` traces a copy of the model frozen at
one size (`ViT.frozen_at`: the position table is a constant) with every dim fixed, and with
the two ops that split ONNX Runtime's mobile partitions written differently (measured with
`onnxruntime.tools.check_onnx_model_mobile_usability` on ViT-Ti/16, docs/edge-targets.md):

- the class-token `Expand` to the batch (CoreML MLProgram: unsupported) becomes a `Concat`
  with a constant of zeros and one `Add` of a constant table holding the prefix tokens and
  every position vector (prefix tokens + positions folded together);
- the pooling `Gather` of token 0 (CoreML MLProgram: unsupported) becomes a constant
  `Slice` and a `Reshape` (mean pooling: `Slice` + `ReduceMean`).

Both are exact rewrites (the same float additions in the same order), so parity holds
bit for bit or within float noise; every file is still checked against PyTorch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from vit_deploy.runtime.files import write_bytes_atomic
from vit_deploy.runtime.contract import LOGITS_NAME, OPSET
from vit_deploy.export.model import Tokens, ViT, reference_model
from vit_deploy.export import onnx as onnx_export
from vit_deploy.export.onnx import finalize, validate_onnx
from vit_deploy.outputs import OutputSelection


class StaticViT(ViT):
    """A ViT frozen at one input size whose forward avoids Expand and Gather.

    Built by `static_model` from a deep copy of the model.
    """

    static_hw: tuple[int, int]

    def forward_tokens(self, x: torch.Tensor, layers: tuple[int, ...] = (), *,
                       patch: int | None = None) -> Tokens:
        """ViT.forward_tokens at exactly `static_hw`, prefix tokens and positions added as
        one constant table."""
        if tuple(x.shape[-2:]) != self.static_hw or patch not in (None, self.cfg.patch_size):
            raise ValueError(f"this graph is static at {self.static_hw} and patch "
                             f"{self.cfg.patch_size}, got {tuple(x.shape[-2:])}, patch {patch}")
        tokens = self.patch_embed(x)  # (B, N, D)
        k = self.cfg.num_prefix_tokens
        if k:  # zeros in the prefix slots, then one Add puts tokens and positions in
            zeros = torch.zeros(x.shape[0], k, tokens.shape[-1], dtype=tokens.dtype)
            tokens = torch.cat([zeros, tokens], dim=1)  # (B, T, D)
        tokens = tokens + self.token_table  # (1, T, D) constant
        kept, size = {}, None
        for i, block in enumerate(self.blocks, start=1):
            tokens, size = block(tokens, size)
            if i in layers:
                kept[i] = tokens
        return Tokens(self.norm(tokens), [kept[b] for b in layers], size)

    def forward_head(self, tokens: torch.Tensor, *, pre_logits: bool = False,
                     size: torch.Tensor | None = None) -> torch.Tensor:
        B, _, D = tokens.shape
        if self.cfg.pool == "cls":
            pooled = tokens[:, 0:1].reshape(B, D)  # Slice + Reshape, not Gather
            pooled = self.fc_norm(pooled)
            if pre_logits:
                return pooled
            if self.head_dist is not None:
                dist = self.fc_norm(tokens[:, 1:2].reshape(B, D))
                return (self.head(pooled) + self.head_dist(dist)) / 2
            return self.head(pooled)
        return super().forward_head(tokens, pre_logits=pre_logits, size=size)  # mean: no Gather


class DecomposedLayerNorm(nn.Module):
    """LayerNorm in elementary ops (ReduceMean, Sub, Mul, Sqrt, Div): ORT's NNAPI EP has no
    LayerNormalization (ViT-Ti/16: 2 per block split NNAPI into 38 partitions)."""

    def __init__(self, norm: nn.LayerNorm):
        super().__init__()
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)
        var = (centred * centred).mean(dim=-1, keepdim=True)
        return centred / torch.sqrt(var + self.eps) * self.weight + self.bias


class PolynomialGELU(nn.Module):
    """Exact GELU, x·(1 + erf(x/√2))/2, with erf by Abramowitz & Stegun 7.1.26 (|error| ≤
    1.5e-7) in ops NNAPI and CoreML MLProgram both take: no Erf (NNAPI), no Abs / Neg /
    Less / Where (CoreML MLProgram), no Reciprocal (NNAPI). |z| is √(z·z) and the sign
    comes back as z / (|z| + 1e-30)."""

    P = 0.3275911
    A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x * (1 / math.sqrt(2))
        a = torch.sqrt(z * z)  # |z|
        t = torch.ones((), dtype=x.dtype) / (a * self.P + 1)  # Div, not Reciprocal
        poly = torch.zeros_like(t)
        for coeff in reversed(self.A):
            poly = (poly + coeff) * t
        erf_abs = 1 - poly * torch.exp(a * a * -1.0)  # erf(|z|)
        return 0.5 * x * (1 + z * erf_abs / (a + 1e-30))


def with_mobile_ops(model: nn.Module) -> nn.Module:
    """`model` (changed in place) with every LayerNorm and GELU written in the ops above."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.LayerNorm):
                setattr(module, name, DecomposedLayerNorm(child))
            elif isinstance(child, nn.GELU):
                setattr(module, name, PolynomialGELU())
    return model


def static_model(model: ViT, height: int, width: int) -> StaticViT:
    """A copy of `model` for one input size: positions and prefix tokens folded into one
    constant table (1, T, D), in the order ViT.forward_features adds them."""
    frozen = model.frozen_at(height, width)
    P = model.cfg.patch_size
    with torch.no_grad():
        pos_prefix, pos_cells = frozen.pos((height // P, width // P))  # (1, k', D), (1, N, D)
        prefix = [t for t in (frozen.cls_token, frozen.dist_token, frozen.reg_token)
                  if t is not None]
        parts = []
        if prefix:
            pre = torch.cat(prefix, dim=1)  # (1, k, D)
            k = pos_prefix.shape[1]
            parts.append(torch.cat([pre[:, :k] + pos_prefix, pre[:, k:]], dim=1))
        parts.append(pos_cells)
        table = torch.cat(parts, dim=1)  # (1, T, D)
    out = frozen  # frozen_at made a deep copy: ours to change
    out.__class__ = StaticViT
    out.register_buffer("token_table", table.detach().clone())
    out.static_hw = (height, width)
    return out.eval()


def export_static(model: ViT, dst: str | Path, *, batch: int, resolution: tuple[int, int],
                  outputs: tuple[str, ...] = (LOGITS_NAME,), layer_norm: bool = True,
                  mobile_ops: bool = False, linear_as_gemm: bool = False,
                  opset: int = OPSET) -> Path:
    """Trace `model` at exactly (batch, C, H, W) into `dst` (atomically); `outputs` are the
    bundle's output names, in its order. `linear_as_gemm`: every linear layer a 2-D Gemm
    (linears_as_gemm)."""
    cfg = model.cfg
    vit = static_model(model.eval(), *resolution)
    if mobile_ops:  # NNAPI / CoreML take every node (docs/edge-targets.md)
        vit = with_mobile_ops(vit)
    module = reference_model(vit, OutputSelection(names=tuple(outputs), layer_norm=layer_norm))
    example = torch.randn(batch, cfg.in_chans, *resolution)
    proto = onnx_export.trace(module, example, output_names=list(outputs), dynamic_shapes=None,
                              opset=opset, what=f"the static graph {batch}x{resolution}")
    finalize(proto, config_json=cfg.to_json())
    if linear_as_gemm:
        linears_as_gemm(proto)
    return write_bytes_atomic(dst, validate_onnx(proto))


def linears_as_gemm(proto: onnx.ModelProto) -> int:
    """Rewrite each linear layer's MatMul(x (..., K), W (K, N)) [+ Add(b)] as Reshape to
    (rows, K), Gemm(W' (N, K), b, transB=1), Reshape back, in place: the same products and
    sums. Qualcomm's HTP takes per-channel int8 weights on a Gemm (its FullyConnected), not
    on a MatMul (measured: targets/htp.py, docs/edge-targets.md). The Gemm keeps the
    MatMul's node name, so the map of linear layers (finalize) still holds, and its own bias
    tensor. Needs static shapes; returns how many layers were rewritten."""
    from onnx import helper, numpy_helper

    from vit_deploy.runtime.contract import METADATA_LINEARS_KEY

    meta = {p.key: p.value for p in proto.metadata_props}
    linear = set(json.loads(meta.get(METADATA_LINEARS_KEY, "{}")).values())
    graph = proto.graph
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else 0
                       for d in v.type.tensor_type.shape.dim]
              for v in [*onnx.shape_inference.infer_shapes(proto).graph.value_info, *graph.input]}
    inits = {i.name: i for i in graph.initializer}
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    nodes, folded, done = [], set(), 0
    for node in graph.node:
        if id(node) in folded:
            continue
        x_shape = shapes.get(node.input[0], [])
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if (node.name not in linear or weight is None or len(weight.dims) != 2
                or len(x_shape) < 2 or 0 in x_shape):
            nodes.append(node)
            continue
        (k, n), out, bias = weight.dims, node.output[0], []
        after = users.get(out, [])
        if len(after) == 1 and after[0].op_type == "Add":
            other = next(i for i in after[0].input if i != out)
            if other in inits and list(inits[other].dims) == [n]:
                # the Gemm's own copy: an exporter may share one zero tensor between biases
                # and LayerNorms, and the quantiser's DequantizeLinear of a bias would then
                # feed the LayerNorms too (on HTP, 25 int32 DequantizeLinear on the CPU)
                own = numpy_helper.from_array(numpy_helper.to_array(inits[other]),
                                              f"{node.name}_bias")
                graph.initializer.append(own)
                out, bias = after[0].output[0], [own.name]
                folded.add(id(after[0]))
        w_t = numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(weight).T),
                                      f"{weight.name}_nk")
        shape_2d = numpy_helper.from_array(np.array([-1, k], np.int64), f"{node.name}_rows")
        shape_back = numpy_helper.from_array(np.array([*x_shape[:-1], n], np.int64),
                                             f"{node.name}_back")
        graph.initializer.extend([w_t, shape_2d, shape_back])
        flat, y = f"{node.name}_in2d", f"{node.name}_out2d"
        nodes += [helper.make_node("Reshape", [node.input[0], shape_2d.name], [flat],
                                   name=f"{node.name}_to2d"),
                  helper.make_node("Gemm", [flat, w_t.name, *bias], [y], name=node.name,
                                   transB=1),
                  helper.make_node("Reshape", [y, shape_back.name], [out],
                                   name=f"{node.name}_back")]
        done += 1
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.value_info[:]
    return done


def op_counts(path: str | Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))
