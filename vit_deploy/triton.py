"""Beyond one process: a Triton Inference Server model repository, and the model's Open
Inference Protocol (KServe v2) metadata.

We do not write a distributed server: this emits what NVIDIA Triton's ONNX Runtime
backend needs. The single-machine HTTP server is `vit_deploy.serve`; it serves the same
model name, tensor names, datatypes and shapes, because both take them from
`model_metadata` here (derived from the manifest's `io`).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_deploy.atomic import atomic_directory, repository_record
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.runtime.manifest import Manifest, load_manifest

KINDS = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}
PLATFORM = "onnxruntime_onnx"  # Triton's name for the ONNX Runtime backend
MODEL_VERSION = "1"  # the one version directory the repository holds
# numpy dtype name (as the manifest writes it) -> Open Inference Protocol datatype; Triton's
# config.pbtxt spells the same type TYPE_<datatype>.
V2_DATATYPES = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int8": "INT8",
                "int16": "INT16", "int32": "INT32", "int64": "INT64", "uint8": "UINT8",
                "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL"}
MAX_NAME_LENGTH = 128
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
NAME_RULE = (f"1 to {MAX_NAME_LENGTH} characters from A-Z a-z 0-9 _ . - (no path separators), "
             f"not starting with '.'")


def _name_problem(name: str) -> str | None:
    if not name:
        return "it is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"it has {len(name)} characters"
    bad = "".join(sorted(set(name) - _NAME_CHARS))
    if bad:
        return f"it has {bad!r}"
    return "it starts with '.'" if name.startswith(".") else None


def check_model_name(name: str) -> str:
    """A Triton model name (a directory in the repository and a config string), or
    ValueError saying what is allowed and what was given."""
    problem = _name_problem(name)
    if problem:
        raise ValueError(f"a Triton model name must be {NAME_RULE}; got {name[:200]!r} "
                         f"({problem})")
    return name


def pbtxt_string(value: str) -> str:
    """`value` as a protobuf text-format string literal, quoted and escaped (ASCII out:
    backslash, double quote and every byte outside printable ASCII are escaped)."""
    out = []
    for byte in value.encode("utf-8"):
        char = chr(byte)
        out.append("\\" + char if char in '\\"' else char if 32 <= byte < 127
                   else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


# Instances per group: Triton reads an int32, and each instance is a session with its own
# copy of the model; more than this is a typo, not a deployment
MAX_INSTANCES = 256


def parse_instances(text: str) -> list[tuple[str, int]]:
    """'cpu:2,gpu:1' -> [('cpu', 2), ('gpu', 1)]."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        kind, _, count = part.partition(":")
        if (kind not in KINDS or not re.fullmatch(r"[0-9]{1,4}", count)
                or not 1 <= int(count) <= MAX_INSTANCES):
            raise ValueError(f"instances must look like cpu:2,gpu:1 (kinds {list(KINDS)}, "
                             f"counts 1..{MAX_INSTANCES}), got {part[:40]!r}")
        out.append((kind, int(count)))
    if not out:
        raise ValueError("no instance group given, e.g. cpu:1")
    return out


# -- the model as the Open Inference Protocol describes it (one source for both servers) --


@dataclass(frozen=True)
class V2Tensor:
    """One input or output: its name, v2 datatype, and full shape with the batch dimension
    first; -1 stands for every dimension that varies (batch, and H, W of a dynamic model)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class V2Model:
    """What `GET /v2/models/NAME` answers, for `vit-deploy serve` and for Triton alike."""

    name: str
    inputs: tuple[V2Tensor, ...]
    outputs: tuple[V2Tensor, ...]
    platform: str = PLATFORM
    versions: tuple[str, ...] = (MODEL_VERSION,)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "versions": list(self.versions), "platform": self.platform,
                "inputs": [t.to_dict() for t in self.inputs],
                "outputs": [t.to_dict() for t in self.outputs]}

    def output(self, name: str) -> V2Tensor | None:
        return next((t for t in self.outputs if t.name == name), None)


def v2_datatype(dtype: str) -> str:
    """'float32' -> 'FP32'; ValueError for a type the protocol has no name for here."""
    try:
        return V2_DATATYPES[dtype]
    except KeyError:
        raise ValueError(f"tensor dtype {dtype!r} has no Open Inference Protocol datatype "
                         f"here (known: {sorted(V2_DATATYPES)})") from None


def model_metadata(manifest: Manifest, name: str) -> V2Model:
    """The model's v2 metadata from the manifest's `io`: every input and output it lists,
    in its order, symbolic dimensions as -1 (the batch dimension always)."""
    def tensor(spec: Any) -> V2Tensor:
        dims = [d if isinstance(d, int) else -1 for d in spec.shape]
        return V2Tensor(spec.name, v2_datatype(spec.dtype), (-1, *dims[1:]))

    return V2Model(name=check_model_name(name),
                   inputs=tuple(tensor(t) for t in manifest.io.inputs),
                   outputs=tuple(tensor(t) for t in manifest.io.outputs))


def _pbtxt_tensors(kind: str, tensors: tuple[V2Tensor, ...]) -> list[str]:
    """`input [ ... ]` / `output [ ... ]`; dims without the batch one (max_batch_size > 0)."""
    lines = [f"{kind} ["]
    for i, t in enumerate(tensors):
        lines += ["  {", f"    name: {pbtxt_string(t.name)}", f"    data_type: TYPE_{t.datatype}",
                  f"    dims: [ {', '.join(str(d) for d in t.shape[1:])} ]",
                  "  }" + ("," if i < len(tensors) - 1 else "")]
    return lines + ["]"]


def triton_config(manifest: Manifest, *, name: str, precision: str, max_batch: int,
                  instances: list[tuple[str, int]], dynamic_batching_us: int | None,
                  accelerator: str | None) -> str:
    """config.pbtxt text for the onnxruntime_onnx platform."""
    model = model_metadata(manifest, name)
    lines = [f"name: {pbtxt_string(model.name)}", f"platform: {pbtxt_string(model.platform)}",
             f"max_batch_size: {max_batch}",
             *_pbtxt_tensors("input", model.inputs), *_pbtxt_tensors("output", model.outputs)]
    lines.append("instance_group [")
    for i, (kind, count) in enumerate(instances):
        lines.append(f"  {{ count: {count} kind: {KINDS[kind]} }}"
                     + ("," if i < len(instances) - 1 else ""))
    lines.append("]")
    if dynamic_batching_us is not None:
        lines += ["dynamic_batching {", f"  max_queue_delay_microseconds: {dynamic_batching_us}",
                  "}"]
    if accelerator:
        params = ('parameters { key: "precision_mode" value: "FP16" } ' if accelerator ==
                  "tensorrt-fp16" else "")
        trt = "tensorrt" if accelerator.startswith("tensorrt") else "cuda"
        lines += ["optimization { execution_accelerators {",
                  f"  gpu_execution_accelerator : [ {{ name : {pbtxt_string(trt)} {params}}} ]",
                  "} }"]
    lines.append(f'parameters {{ key: "vit_deploy_precision" value: '
                 f'{{ string_value: {pbtxt_string(precision)} }} }}')
    purpose = manifest.purpose  # what a client asks for: the embedding output, its similarity
    for key, value in (("vit_deploy_purpose", purpose.kind),
                       ("vit_deploy_classifier", purpose.classifier),
                       ("vit_deploy_embedding", purpose.embedding),
                       ("vit_deploy_similarity", purpose.similarity if purpose.embedding else None)):
        if value is not None:
            lines.append(f'parameters {{ key: "{key}" value: '
                         f'{{ string_value: {pbtxt_string(value)} }} }}')
    return "\n".join(lines) + "\n"


def model_name(name: str | None, bundle: str | Path) -> str:
    """--name, checked; without one, the bundle directory's name if it is a valid one."""
    if name is not None:
        return check_model_name(name)
    try:
        return check_model_name(Path(bundle).name)
    except ValueError as e:
        raise ValueError(f"the bundle directory's name cannot be the model name ({e}): "
                         f"pass --name") from None


def triton_repository(bundle: str | Path, out: str | Path, *, precision: str = "fp32",
                      name: str | None = None, max_batch: int = 8,
                      instances: list[tuple[str, int]] = [("cpu", 1)],  # noqa: B006
                      dynamic_batching_us: int | None = 1000, accelerator: str | None = None,
                      force: bool = False) -> tuple[Path, str, list[str]]:
    """Write REPO/<name>/1/model.onnx and REPO/<name>/config.pbtxt; returns (repo, notes)."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    manifest.require_nchw("vit-deploy triton")
    model_path = manifest.model_path(bundle, precision)
    if max_batch < 1:
        raise ValueError(f"max batch must be >= 1, got {max_batch}")
    name = model_name(name, bundle)
    notes = []
    if manifest.batch_coupled(precision) and dynamic_batching_us is not None:
        notes.append(f"{precision} quantises activations per batch: Triton's dynamic batching "
                     f"would make a request's result depend on its batch-mates, so it is off")
        dynamic_batching_us = None
    text = triton_config(manifest, name=name, precision=precision, max_batch=max_batch,
                         instances=instances, dynamic_batching_us=dynamic_batching_us,
                         accelerator=accelerator)
    with atomic_directory(out, force=force, source=bundle) as tmp:
        (tmp / name / MODEL_VERSION).mkdir(parents=True)
        shutil.copy2(model_path, tmp / name / MODEL_VERSION / "model.onnx")
        (tmp / name / "config.pbtxt").write_text(text)
        (tmp / MANIFEST_NAME).write_text(json.dumps(repository_record(tmp, bundle, "triton"), indent=2))
    return Path(out), name, notes
