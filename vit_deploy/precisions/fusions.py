"""Offline graph fusions ONNX Runtime's session optimiser does not find in our graphs."""

from __future__ import annotations

from pathlib import Path

import onnx


def fuse_for_cpu(path: Path, source: onnx.ModelProto, *, gelu: bool = True,
                 attention: bool = True) -> dict[str, str]:
    """The fusions of a CPU precision's file at `path` (int8, int8-static), in place; what
    was done, for its recipe. `source`: the model it was quantised from (its metadata says
    how many attention heads)."""
    done = {}
    if gelu:
        fused = fuse_gelu(path)
        done["gelu"] = f"{fused} GELU subgraphs fused into com.microsoft.Gelu (exact)"
    if attention:
        heads = _heads(source)
        fused = fuse_attention(path, heads) if heads else 0
        done["attention"] = (f"{fused} attention cores fused into com.microsoft."
                             f"MultiHeadAttention (float, {heads} heads)" if fused
                             else "not fused (not the plain pattern)")
    return done


def _heads(model: onnx.ModelProto) -> int | None:
    """The attention heads our exporter recorded in the model's metadata (None: a foreign
    file, whose attention is then left as it is)."""
    from vit_deploy.runtime.config import ViTConfig
    from vit_deploy.runtime.contract import METADATA_CONFIG_KEY

    text = next((p.value for p in model.metadata_props if p.key == METADATA_CONFIG_KEY), None)
    try:
        return ViTConfig.from_json(text).heads if text else None
    except (TypeError, ValueError):
        return None


def fuse_gelu(path: Path) -> int:
    """Replace x * 0.5 * (1 + erf(x / sqrt 2)) (the dynamo exporter's GELU, any operand
    order) by com.microsoft.Gelu(x) in the file at `path`; returns how many.

    ORT's own offline fusion (onnxruntime.transformers FusionGelu), measured against the
    hand-written matcher it replaced on the tiny model's int8 graph: both fuse 2 of 2,
    the same op counts (124 -> 116 nodes), and bit-identical logits."""
    from onnxruntime.transformers.fusion_gelu import FusionGelu
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(path)))
    fusion = FusionGelu(model)
    fusion.apply()  # also drops the initializers only the fused nodes read
    fused = sum(n.op_type == "Gelu" for n in fusion.nodes_to_add)
    if not fused:
        return 0
    model.remove_unused_constant()
    if not any(o.domain == "com.microsoft" for o in model.model.opset_import):
        model.model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    model.topological_sort()  # the fused nodes were appended at the end
    onnx.save(model.model, str(path))
    return fused



def fuse_attention(path: Path, heads: int) -> int:
    """Replace each block's attention core (the qkv output reshaped to heads, split, Q K^T
    scaled, Softmax, A V, heads merged back) by one com.microsoft.MultiHeadAttention on the
    three thirds of the qkv output, in the file at `path`; returns how many. ONNX Runtime's
    CPU kernel for it computes attention in tiles (no (B, H, N, N) tensor in memory).

    Matched strictly from the Softmax outwards: Q, K and V must come from one Split of the
    (B, heads, N, d)-shaped qkv output, the scale must be constant; anything else (rotary
    positions between the split and the product, ToMe's size bias, a mask, an intermediate
    that something else reads) is left as it is."""
    import numpy as np
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(path)))
    producer, consumers = model.output_name_to_node(), model.input_name_to_nodes()

    def up(name: str, op: str):
        node = producer.get(name)
        return node if node is not None and node.op_type == op else None

    def only_consumer(name: str, op: str):
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op else None

    def scaled(name: str) -> tuple[str, float] | None:
        """(tensor, scale) for Mul(tensor, constant scalar), or (name, 1.0) for no Mul."""
        mul = up(name, "Mul")
        if mul is None:
            return name, 1.0
        for i in (0, 1):
            value = model.get_constant_value(mul.input[i])
            if value is not None and np.asarray(value).size == 1:
                return mul.input[1 - i], float(np.asarray(value).reshape(()))
        return None

    fused, dead = 0, []
    for softmax in [n for n in model.model.graph.node if n.op_type == "Softmax"]:
        qk = up(softmax.input[0], "MatMul")
        av = only_consumer(softmax.output[0], "MatMul")
        if qk is None or av is None or av.input[0] != softmax.output[0]:
            continue
        q, k = scaled(qk.input[0]), scaled(qk.input[1])
        if q is None or k is None:
            continue
        split = up(q[0], "Split")
        # K^T: Reshape(Transpose(Reshape(split output 1))) as the dynamo exporter writes it
        k_path, name = [], k[0]
        for op in ("Reshape", "Transpose", "Reshape"):
            node = up(name, op)
            if node is None:
                break
            k_path.append(node)
            name = node.input[0]
        if (split is None or len(split.output) != 3 or len(k_path) != 3
                or list(split.output) != [q[0], name, av.input[1]]):
            continue
        heads_t = up(split.input[0], "Transpose")
        qkv_view = up(heads_t.input[0], "Reshape") if heads_t is not None else None
        merge_t = only_consumer(av.output[0], "Transpose")
        merged = only_consumer(merge_t.output[0], "Reshape") if merge_t is not None else None
        if qkv_view is None or merged is None:
            continue
        core = [merged, merge_t, av, softmax, qk, *k_path, split, heads_t, qkv_view]
        core += [producer[n] for n in (qk.input[0], qk.input[1]) if n in producer
                 and producer[n].op_type == "Mul"]
        inside = {id(n) for n in core}

        def feeds_core_only(node, depth: int = 0) -> bool:
            """True when everything `node` computes ends in the core (the shape arithmetic
            of the K reshape); False when it reaches anything else (ToMe reads the keys)."""
            if id(node) in inside:
                return True
            users = [u for out in node.output for u in consumers.get(out, [])]
            return depth < 8 and bool(users) and all(feeds_core_only(u, depth + 1)
                                                     for u in users)

        readers = [u for node in core if node is not merged for out in node.output
                   for u in consumers.get(out, []) if id(u) not in inside]
        if not all(feeds_core_only(u) for u in readers):
            continue  # an intermediate is read elsewhere: not ours to remove
        qkv, tag = qkv_view.input[0], f"fused_attention_{fused}"
        thirds = [f"{tag}/{part}" for part in ("q", "k", "v")]
        model.add_node(onnx.helper.make_node("Split", [qkv], thirds, name=f"{tag}/split",
                                             axis=-1, num_outputs=3))
        model.add_node(onnx.helper.make_node(
            "MultiHeadAttention", thirds, [merged.output[0]], name=tag, domain="com.microsoft",
            num_heads=heads, scale=q[1] * k[1]))
        dead += core
        fused += 1
    if not fused:
        return 0
    model.remove_nodes(dead)
    model.prune_graph()
    if not any(o.domain == "com.microsoft" for o in model.model.opset_import):
        model.model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    model.topological_sort()
    onnx.save(model.model, str(path))
    return fused
