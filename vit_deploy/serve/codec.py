"""The Open Inference Protocol (KServe v2 REST) codec: an infer request's body (JSON
tensors, or the binary tensor data extension: `Inference-Header-Content-Length`), gzip /
deflate encoded or not, to arrays; arrays to an infer answer.

Declared sizes are checked before data is read (tensor shapes x datatype); non-finite
numbers are refused in inputs (400) and never sent as JSON."""

import asyncio
import json
import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request

from vit_deploy.serve.errors import Failure
from vit_deploy.serve.limits import MAX_INFER_BYTES, BodyClaim, Limits, read_body
from vit_deploy.serve.tensor_json import bad_request, json_tensor, json_type, load_header, \
    shape_text
from vit_deploy.triton import MODEL_VERSION, V2_DATATYPES, V2Model

HEADER_LENGTH = "inference-header-content-length"  # the binary tensor data extension

_NUMPY = {datatype: np.dtype(name).newbyteorder("<") for name, datatype in V2_DATATYPES.items()}


@dataclass(frozen=True)
class InferRequest:
    """A parsed v2 infer request: input arrays by name, the outputs to return in order
    with whether each goes as binary data, and the request id to echo."""

    inputs: dict[str, np.ndarray]
    outputs: tuple[tuple[str, bool], ...]
    id: str | None = None


async def read_infer_body(request: Request, limit: int = MAX_INFER_BYTES,
                          claim: BodyClaim | None = None) -> bytes:
    """A v2 infer body, counted as it arrives and inflated if gzip / deflate encoded (as
    tritonclient sends with request compression); Failure(4xx) if it is too large or
    cannot be read. With a claim, the inflated bytes are claimed too."""
    body = await read_body(request, limit, "inference request", claim)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise Failure(415, f"content-encoding must be gzip, deflate or identity, got "
                           f"{encoding!r}")
    if claim is not None:
        claim.need(len(body) + limit)  # the inflated body may reach the limit
    return await asyncio.to_thread(_inflate, body, encoding, limit)


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)  # deflate: zlib format
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as e:
        raise Failure(400, f"the body is not valid {encoding} data: {e}") from None
    if len(out) > limit:
        raise Failure(413, f"inference request inflates to over the limit of {limit} bytes")
    if not inflater.eof:
        raise Failure(400, f"the body is truncated {encoding} data")
    return out



def require_finite(what: str, x: np.ndarray, datatype: str) -> None:
    """Failure(400) naming how many values of a float tensor are NaN / +-Infinity (or were
    out of the datatype's range, e.g. 1e39 for FP32) and where the first one is."""
    if x.dtype.kind != "f":
        return
    bad = ~np.isfinite(x)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), x.shape)
        raise bad_request(f"{what} holds {int(bad.sum())} value(s) that are not finite {datatype} "
                          f"numbers (NaN, Infinity, or beyond {datatype}'s range of "
                          f"+-{float(np.finfo(x.dtype).max):.4g}), the first at index "
                          f"{list(map(int, first))}: expected finite numbers")


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _list_of_objects(value: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise bad_request(f"{what} must be a JSON array of objects, got {json_type(value)}")
    odd = next((v for v in value if not isinstance(v, dict)), None)
    if odd is not None or None in value:
        raise bad_request(f"{what} must be a JSON array of objects, got an array holding "
                          f"{json_type(odd)}")
    return value


def parse_infer_request(body: bytes, header_length: str | None, model: V2Model, *,
                        max_batch: int, limits: Limits | None = None) -> InferRequest:
    """A v2 infer body -> InferRequest, or Failure(400) saying what is wrong: malformed
    JSON, a field of the wrong JSON type, an unknown input or output, a datatype or shape
    the model does not take, data that does not fill the shape, binary data that does not
    add up, non-finite numbers. Failure(413) when a declared shape is over the limit (said
    before its data is read)."""
    limits = limits or Limits()
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        text = header_length.strip()
        if not text.isdigit():
            raise bad_request(f"Inference-Header-Content-Length must be a number of bytes, got "
                              f"{header_length[:40]!r}")
        if int(text) > len(body):
            raise bad_request(f"Inference-Header-Content-Length says the JSON header is "
                              f"{int(text)} bytes, but the body has only {len(body)}")
        header, binary = body[:int(text)], memoryview(body)[int(text):]
    request, spans = load_header(header, limits.max_json_bytes)
    if not isinstance(request, dict):
        raise bad_request(f"the request must be a JSON object, got {type(request).__name__}")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise bad_request(f"id must be a string, got {type(request_id).__name__}")
    parameters = _object(request.get("parameters"), "parameters")
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise bad_request("parameters.binary_data_output must be true or false")

    specs = {t.name: t for t in model.inputs}
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for index, item in enumerate(_list_of_objects(request.get("inputs"), "inputs")):
        name = item.get("name")
        if not isinstance(name, str):
            raise bad_request(f"inputs[{index}].name must be a string (one of {list(specs)}), got "
                              f"{json_type(name)}")
        if name not in specs:
            raise bad_request(f"unknown input {name!r}: model {model.name!r} takes {list(specs)}")
        if name in inputs:
            raise bad_request(f"input {name!r} is given twice")
        spec = specs[name]
        if item.get("datatype") != spec.datatype:
            given = item.get("datatype")
            given = repr(given) if isinstance(given, str) else json_type(given)
            raise bad_request(f"input {name!r} has datatype {given}; the model takes "
                              f"{spec.datatype}")
        shape = item.get("shape")
        if not (isinstance(shape, list) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                and len(shape) == len(spec.shape)
                and all(w in (-1, d) for w, d in zip(spec.shape, shape))):
            raise bad_request(f"input {name!r} has shape {shape!r}; the model takes "
                              f"{shape_text(spec.shape)} (-1: any size)")
        if not 1 <= shape[0] <= max_batch:
            raise bad_request(f"input {name!r} holds a batch of {shape[0]}; this server takes "
                              f"1 to {max_batch} (its max batch)")
        if limits.max_side and len(shape) == 4 and max(shape[2:]) > limits.max_side:
            raise Failure(413, f"input {name!r} is {shape[2]}x{shape[3]}; this server takes "
                               f"sides up to {limits.max_side} (the bundle's largest checked "
                               f"size; serve --max-size to change it)")
        dtype = _NUMPY[spec.datatype]
        declared = math.prod(shape) * dtype.itemsize
        if declared > limits.max_infer_bytes:
            raise Failure(413, f"input {name!r} has shape {shape_text(shape)} of "
                               f"{spec.datatype}: {declared} bytes, over the limit of "
                               f"{limits.max_infer_bytes}")
        iparams = _object(item.get("parameters"), f"input {name!r}: parameters")
        if "shared_memory_region" in iparams:
            raise bad_request("the shared memory extension is not supported: send the data")
        size = iparams.get("binary_data_size")
        if size is not None:
            need = math.prod(shape) * dtype.itemsize
            if not isinstance(size, int) or isinstance(size, bool) or size != need:
                raise bad_request(f"input {name!r}: binary_data_size is {size!r}, shape "
                                  f"{shape_text(shape)} of {spec.datatype} needs {need} bytes")
            if offset + size > len(binary):
                raise bad_request(f"input {name!r}: its binary data would end at byte "
                                  f"{offset + size} after the JSON header, but only "
                                  f"{len(binary)} bytes follow it")
            inputs[name] = np.frombuffer(binary[offset:offset + size], dtype).reshape(shape)
            offset += size
        elif "data" in item:
            inputs[name] = json_tensor(name, item["data"], shape, dtype, spans)
        else:
            raise bad_request(f"input {name!r} has neither data nor a binary_data_size parameter")
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise bad_request(f"missing input(s) {missing}: model {model.name!r} takes {list(specs)}")
    if offset != len(binary):
        raise bad_request(f"{len(binary) - offset} bytes after the JSON header belong to no input "
                          f"(the inputs' binary_data_size add up to {offset})")
    for name, x in inputs.items():
        require_finite(f"input {name!r}", x, specs[name].datatype)

    outputs: list[tuple[str, bool]] = []
    for index, item in enumerate(_list_of_objects(request.get("outputs", []), "outputs")):
        name = item.get("name")
        if not isinstance(name, str):
            raise bad_request(f"outputs[{index}].name must be a string (one of "
                              f"{[t.name for t in model.outputs]}), got {json_type(name)}")
        if model.output(name) is None:
            raise bad_request(f"unknown output {name!r}: model {model.name!r} gives "
                              f"{[t.name for t in model.outputs]}")
        if name in (n for n, _ in outputs):
            raise bad_request(f"output {name!r} is asked for twice")
        oparams = _object(item.get("parameters"), f"output {name!r}: parameters")
        for unsupported, what in (("classification", "the classification extension"),
                                  ("shared_memory_region", "the shared memory extension")):
            if unsupported in oparams:
                raise bad_request(f"output {name!r}: {what} is not supported (ask for the raw "
                                  f"output; POST /predict classifies)")
        binary = oparams.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise bad_request(f"output {name!r}: binary_data must be true or false")
        outputs.append((name, binary))
    if not outputs:  # none named: all of them
        outputs = [(t.name, binary_default) for t in model.outputs]
    return InferRequest(inputs=inputs, outputs=tuple(outputs), id=request_id)


def encode_infer_response(model: V2Model, request: InferRequest,
                          results: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of a v2 infer answer: JSON, followed by the binary outputs' bytes
    (little-endian, row-major) when any output asked for binary data. Failure(500) if an
    output holds NaN / Infinity: that is a broken model, not data (and not JSON)."""
    outputs, blobs = [], []
    for name, binary in request.outputs:
        datatype = model.output(name).datatype  # type: ignore[union-attr]  # parsed: it exists
        value = np.ascontiguousarray(results[name], dtype=_NUMPY[datatype])
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise Failure(500, f"the model's output {name!r} holds "
                               f"{int((~np.isfinite(value)).sum())} non-finite value(s) (NaN or "
                               f"Infinity) for finite inputs: not sent as data")
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(value.shape)}
        if binary:
            blobs.append(value.tobytes())
            entry["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            entry["data"] = value.ravel().tolist()
        outputs.append(entry)
    answer: dict[str, Any] = {"model_name": model.name, "model_version": MODEL_VERSION}
    if request.id is not None:
        answer["id"] = request.id
    header = json.dumps(answer | {"outputs": outputs}, separators=(",", ":"),
                        allow_nan=False).encode()
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {"content-type": "application/octet-stream",
                                      HEADER_LENGTH: str(len(header))}
