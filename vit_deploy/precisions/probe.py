"""A probe session: a graph's intermediate tensors read on the CPU provider (which layers of
a quantised graph cost accuracy: precisions/photos.py)."""

from __future__ import annotations

from typing import Any

import onnx


def tensor_probe(model: onnx.ModelProto, names: list[str]) -> Any:
    """A function x -> {name: value} of the graph's tensors `names` (its own outputs are
    replaced by them) on the CPU provider, for input batches x of the model's one input.
    `model` is not changed."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend([onnx.ValueInfoProto(name=n) for n in names])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(probe.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0].name
    return lambda x: dict(zip(names, session.run(names, {feed: x})))
