"""What a model file holds, found before ONNX Runtime opens it (torch-free).

External data must stay inside the model's directory (and, in a bundle, be listed with
its hash in the manifest); dynamic int8 couples a batch (one activation scale per tensor).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from vit_deploy.runtime.manifest_parts import BundleError

# Both batch-coupling ops (DynamicQuantizeLinear, DynamicQuantizeMatMul) contain this name;
# each needle costs a full pass over the file (0.12 s for ViT-B/16 fp32).
_COUPLING_OP = b"DynamicQuantize"


def inspect_model(path: Path, listed: Collection[str] | None) -> bool:
    """Before ORT opens the file: refuse external data outside the model's directory (or,
    in a bundle, not covered by the manifest's hashes). Returns whether the graph quantises
    activations per tensor at run time (batch-coupled).

    The file is first scanned in chunks for the strings that external data and the
    batch-coupling ops must contain; the protobuf is parsed only when one is present
    (parsing a 85 MB model up front cost 35 MB of peak memory per session)."""
    found = _file_contains(path, (b"location", _COUPLING_OP))
    if b"location" in found:
        _check_external_data(path, listed)
    return _COUPLING_OP in found


def _file_contains(path: Path, needles: tuple[bytes, ...], chunk: int = 1 << 20) -> set[bytes]:
    found: set[bytes] = set()
    keep = max(len(n) for n in needles) - 1
    tail = b""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            window = tail + block
            found.update(n for n in needles if n in window)
            tail = window[-keep:]
    return found


def _check_external_data(path: Path, listed: Collection[str] | None) -> None:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and friends: a truncated or foreign file
        raise BundleError(f"{str(path)!r} is not a readable ONNX model: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    root = path.parent.resolve()
    tensors = list(model.graph.initializer) + [
        a.t for n in model.graph.node for a in n.attribute if a.HasField("t")]
    for tensor in tensors:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        target = (root / location).resolve()
        if root not in target.parents:
            raise BundleError(f"{str(path)!r}: tensor {tensor.name!r} points to external data "
                              f"{location!r}, outside the model's directory; refused")
        if listed is not None and target.relative_to(root).as_posix() not in listed:
            raise BundleError(f"{str(path)!r}: external data {location!r} is not listed (and "
                              f"hashed) in the manifest; refused")


def int8_weights_need(path: Path) -> str | None:
    """What the int8 weights in the file need of a CPU (runtime/cpu.py), read from the file
    itself, not from the recipe that says how it was made: 'vnni' when a weight matrix
    holds a value outside [-64, 64], the 7-bit range ONNX Runtime's reduce_range gives
    (255 x 64 x 2 = 32640 still fits AVX2's 16-bit pair sums; 8-bit weights do not), 'any' when every int8 weight fits, None when the file has no int8 weights (or
    keeps them outside it). Read only where the CPU could saturate (a VNNI CPU never does)."""
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # unreadable: ONNX Runtime says so when it opens the file
        return None
    need = None
    for t in model.graph.initializer:
        if t.data_type != onnx.TensorProto.INT8 or len(t.dims) < 2 \
                or t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        w = numpy_helper.to_array(t)
        if w.size and (int(w.min()) < -64 or int(w.max()) > 64):
            return "vnni"
        need = "any"
    return need
