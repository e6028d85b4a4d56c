"""CPU levers that were measured and not kept: build their graphs from a bundle, check
them against the bundle's fp32 model, and print the `cpu_vs_peers.py` line that times them.

    python benchmarks/cpu_levers.py vit-B16-448 --out levers/
    python benchmarks/cpu_vs_peers.py vit-B16-448 --res 224,448 --engines ort:int8,... \\
        --graph int8_mha=levers/int8_mha.onnx ...

- `int8_mha`: the bundle's int8 file with each block's attention core (q·kᵀ, Softmax, ·v
  and the transposes around them) replaced by ORT's contrib `MultiHeadAttention` on q, k, v
  sliced from the qkv output.
- `int8_attn_qk`, `int8_attn_qkav`: dynamic int8 with the attention matmuls quantised too
  (q·kᵀ; q·kᵀ and probabilities·v), both operands quantised at run time.
- `int8_skipln`: the bundle's int8 file with each residual Add + LayerNormalization fused
  into ORT's contrib `SkipLayerNormalization` (ORT's own offline fusion; its session
  optimiser does not find them in our graph).
docs/cpu-speed.md gives what each measured.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import vit_deploy  # noqa: F401  (first: ONNX Runtime's telemetry is off before it loads)
import onnxruntime as ort
from onnx import helper, numpy_helper


def fuse_attention(model: onnx.ModelProto, heads: int, width: int) -> int:
    """Replace the exporter's attention core of each block (Reshape -> Transpose(0,2,1,3)
    -> Split of the qkv output; q, kᵀ each scaled by a scalar Mul; MatMul; Softmax; MatMul
    with v; Transpose(0,2,1,3) -> Reshape) by Split(qkv, last axis) -> MultiHeadAttention,
    in place; returns how many. Anything that does not match exactly is left alone."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}

    def only(name: str, op: str) -> onnx.NodeProto | None:
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op else None

    def attr(node: onnx.NodeProto | None, name: str) -> Any:
        if node is None:
            return None
        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name),
                    None)

    def unscaled(name: str) -> tuple[str, float]:
        node = producer.get(name)
        if node is not None and node.op_type == "Mul":
            for a, b in (node.input, node.input[::-1]):
                if b in consts and consts[b].size == 1:
                    return a, float(consts[b].reshape(()))
        return name, 1.0

    added, fused = [], 0
    for softmax in [n for n in graph.node if n.op_type == "Softmax"]:
        logits = producer.get(softmax.input[0])
        apply_v = only(softmax.output[0], "MatMul")
        if logits is None or logits.op_type != "MatMul" or apply_v is None:
            continue
        split = producer.get(apply_v.input[1])
        if split is None or split.op_type != "Split" or len(split.output) != 3 \
                or split.output[2] != apply_v.input[1] or attr(split, "axis") != 1:
            continue
        transpose = producer.get(split.input[0])
        if transpose is None or list(attr(transpose, "perm") or []) != [0, 2, 1, 3] \
                or producer.get(transpose.input[0]) is None \
                or producer[transpose.input[0]].op_type != "Reshape":
            continue
        q, q_scale = unscaled(logits.input[0])
        k_t, k_scale = unscaled(logits.input[1])
        node, hops = producer.get(k_t), 0  # kᵀ: Reshape -> Transpose -> Reshape of k
        while node is not None and node.input[0] != split.output[1] and hops < 4:
            node, hops = producer.get(node.input[0]), hops + 1
        back = only(apply_v.output[0], "Transpose")
        merge = only(back.output[0], "Reshape") if back is not None else None
        if q != split.output[0] or node is None or merge is None \
                or list(attr(back, "perm") or []) != [0, 2, 1, 3]:
            continue
        qkv = producer[transpose.input[0]].input[0]
        base = f"mha_{fused}"
        graph.initializer.append(numpy_helper.from_array(np.array([width] * 3, np.int64),
                                                         f"{base}_sizes"))
        added.append(helper.make_node("Split", [qkv, f"{base}_sizes"],
                                      [f"{base}_q", f"{base}_k", f"{base}_v"], axis=2))
        added.append(helper.make_node("MultiHeadAttention", [f"{base}_q", f"{base}_k", f"{base}_v"],
                                      [merge.output[0]], name=base, domain="com.microsoft",
                                      num_heads=heads, scale=q_scale * k_scale))
        graph.node.remove(merge)
        fused += 1
    if fused:
        graph.node.extend(added)
        _prune(model)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return fused


def _prune(model: onnx.ModelProto) -> None:
    """Drop nodes and initializers nothing reads; sort the graph."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        read = {i for n in graph.node for i in n.input} | outputs
        dead = [n for n in graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    read = {i for n in graph.node for i in n.input}
    for init in [i for i in graph.initializer if i.name not in read]:
        graph.initializer.remove(init)
    OnnxModel(model).topological_sort()


def int8_with_attention(fp32: Path, dst: Path, *, apply_v: bool) -> None:
    """Dynamic int8 as the bundle makes it, plus the attention matmuls."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import vit_deploy.precisions.quantize as q
    from vit_deploy.precisions.fusions import fuse_gelu

    model = q._clean(onnx.load(str(fp32)))
    layers = q.quantisable_layers(model, head=True)
    q._gemm_to_matmul(model, layers["head"])
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    softmaxes = [n for n in model.graph.node if n.op_type == "Softmax"]
    extra = [producer[n.input[0]].name for n in softmaxes]
    if apply_v:
        extra += [consumers[n.output[0]][0].name for n in softmaxes]
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, f"{tmp}/in.onnx")
        with q._quiet_quantizer():
            quantize_dynamic(f"{tmp}/in.onnx", str(dst), op_types_to_quantize=["MatMul"],
                             nodes_to_quantize=list(layers.values()) + extra, per_channel=True,
                             reduce_range=False, weight_type=QuantType.QInt8,
                             extra_options={"MatMulConstBOnly": False})
    fuse_gelu(dst)


def cosines(reference: Path, candidate: Path, sizes: list[tuple[int, int]]) -> list[float]:
    a = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(candidate), providers=["CPUExecutionProvider"])
    name = a.get_inputs()[0].name
    out = []
    for hw in sizes:
        x = np.random.default_rng(0).standard_normal((1, 3, *hw), dtype=np.float32)
        ya, yb = a.run(None, {name: x})[0].ravel(), b.run(None, {name: x})[0].ravel()
        out.append(float(ya @ yb / np.linalg.norm(ya) / np.linalg.norm(yb)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    bundle, out = Path(args.bundle), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((bundle / "manifest.json").read_text())["config"]
    sizes = [(224, 224), (320, 480)]
    graphs = {}
    model = onnx.load(str(bundle / "model.int8.onnx"))
    n = fuse_attention(model, cfg["heads"], cfg["width"])
    onnx.save(model, str(out / "int8_mha.onnx"))
    graphs["int8_mha"] = f"{n} attention cores -> MultiHeadAttention"
    from onnxruntime.transformers.fusion_skiplayernorm import FusionSkipLayerNormalization
    from onnxruntime.transformers.onnx_model import OnnxModel

    wrapped = OnnxModel(onnx.load(str(bundle / "model.int8.onnx")))
    FusionSkipLayerNormalization(wrapped).apply()
    wrapped.remove_unused_constant()
    wrapped.topological_sort()
    onnx.save(wrapped.model, str(out / "int8_skipln.onnx"))
    fused = sum(n.op_type == "SkipLayerNormalization" for n in wrapped.model.graph.node)
    graphs["int8_skipln"] = f"{fused} Add + LayerNorm -> SkipLayerNormalization"
    fp32 = onnx.load(str(bundle / "model.onnx"))
    fuse_attention(fp32, cfg["heads"], cfg["width"])
    onnx.save(fp32, str(out / "fp32_mha.onnx"))
    for name, apply_v in (("int8_attn_qk", False), ("int8_attn_qkav", True)):
        int8_with_attention(bundle / "model.onnx", out / f"{name}.onnx", apply_v=apply_v)
        graphs[name] = "attention matmuls in int8 too"
    exact = cosines(bundle / "model.onnx", out / "fp32_mha.onnx", sizes)
    print(f"fp32 with MultiHeadAttention vs fp32: cosine {min(exact):.7f} (the rewrite is exact)")
    for name, what in graphs.items():
        c = cosines(bundle / "model.onnx", out / f"{name}.onnx", sizes)
        print(f"{name}: {what}; cosine vs fp32 at {sizes}: {', '.join(f'{v:.5f}' for v in c)}")
    (out / "fp32_mha.onnx").unlink()
    engines = ",".join(["ort:int8"] + [f"ort-file:{g}" for g in graphs])
    print("\ntime them:\npython benchmarks/cpu_vs_peers.py", bundle, "--res 224,448 --engines",
          engines, " ".join(f"--graph {g}={out / g}.onnx" for g in graphs))


if __name__ == "__main__":
    main()
