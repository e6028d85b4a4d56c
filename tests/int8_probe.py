"""Run int8 files on whatever CPU this process sees; print JSON. numpy + onnxruntime only.

Run natively, or under `qemu-x86_64 -cpu Haswell` (an x86 CPU with AVX2 and no VNNI or
AVX-512): ONNX Runtime then picks its AVX2 int8 kernels, whose u8 x s8 pair sums saturate
at 16 bits, as on such a machine. Used by tests/test_int8_cpu.py.

    python int8_probe.py JOB.json   # {"files": [...], "inputs": "x.npz"} -> outputs.npz
"""

import json
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def saturation() -> dict:
    """255 x 127 summed over 64 pairs: exact is 2072640; a 16-bit pair sum clips it."""
    k = 64
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "sat",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [1, k])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [1, 8])],
        [numpy_helper.from_array(np.full((k, 8), 127, np.int8), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = int(s.run(None, {"A": np.full((1, k), 255, np.uint8)})[0][0, 0])
    return {"got": got, "exact": 255 * 127 * k}


def main(job_path: str) -> None:
    job = json.load(open(job_path))
    inputs = np.load(job["inputs"])
    outputs = {}
    for i, path in enumerate(job["files"]):
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for key in inputs.files:
            outputs[f"{i}/{key}"] = s.run(None, {s.get_inputs()[0].name: inputs[key]})[0]
    np.savez(job["outputs"], **outputs)
    print(json.dumps({"saturation": saturation()}))


if __name__ == "__main__":
    main(sys.argv[1])
