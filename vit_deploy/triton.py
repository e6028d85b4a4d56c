"""Beyond one process: a Triton Inference Server model repository.

We do not write a distributed server: this emits what NVIDIA Triton's ONNX Runtime
backend needs. The single-machine HTTP server is `vit_deploy.server`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from vit_deploy.atomic import atomic_directory, repository_record
from vit_deploy.contract import FEATURES_NAME, INPUT_NAME, LOGITS_NAME, MANIFEST_NAME
from vit_deploy.runtime.manifest import Manifest, load_manifest

KINDS = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}
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


def parse_instances(text: str) -> list[tuple[str, int]]:
    """'cpu:2,gpu:1' -> [('cpu', 2), ('gpu', 1)]."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        kind, _, count = part.partition(":")
        if kind not in KINDS or not count.isdigit() or int(count) < 1:
            raise ValueError(f"instances must look like cpu:2,gpu:1 (kinds {list(KINDS)}, "
                             f"counts >= 1), got {part!r}")
        out.append((kind, int(count)))
    if not out:
        raise ValueError("no instance group given, e.g. cpu:1")
    return out


def triton_config(manifest: Manifest, *, name: str, precision: str, max_batch: int,
                  instances: list[tuple[str, int]], dynamic_batching_us: int | None,
                  accelerator: str | None) -> str:
    """config.pbtxt text for the onnxruntime_onnx platform."""
    io = manifest.io
    C = manifest.config.in_chans
    dims = "[ %d, -1, -1 ]" % C if io.dynamic else "[ %d, %d, %d ]" % (
        C, *manifest.deploy_resolution)
    lines = [f"name: {pbtxt_string(name)}", 'platform: "onnxruntime_onnx"',
             f"max_batch_size: {max_batch}",
             "input [", "  {", f"    name: {pbtxt_string(INPUT_NAME)}", "    data_type: TYPE_FP32",
             f"    dims: {dims}", "  }", "]", "output ["]
    outputs = [o for o in io.outputs if o.name in (LOGITS_NAME, FEATURES_NAME)]
    for i, o in enumerate(outputs):
        lines += ["  {", f"    name: {pbtxt_string(o.name)}", "    data_type: TYPE_FP32",
                  f"    dims: [ {o.shape[-1]} ]", "  }" + ("," if i < len(outputs) - 1 else "")]
    lines.append("]")
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
    return "\n".join(lines) + "\n"


def _model_name(name: str | None, bundle: Path) -> str:
    """--name, checked; without one, the bundle directory's name if it is a valid one."""
    if name is not None:
        return check_model_name(name)
    try:
        return check_model_name(bundle.name)
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
    model_path = manifest.model_path(bundle, precision)
    if max_batch < 1:
        raise ValueError(f"max batch must be >= 1, got {max_batch}")
    name = _model_name(name, bundle)
    notes = []
    if manifest.batch_coupled(precision) and dynamic_batching_us is not None:
        notes.append(f"{precision} quantises activations per batch: Triton's dynamic batching "
                     f"would make a request's result depend on its batch-mates, so it is off")
        dynamic_batching_us = None
    text = triton_config(manifest, name=name, precision=precision, max_batch=max_batch,
                         instances=instances, dynamic_batching_us=dynamic_batching_us,
                         accelerator=accelerator)
    with atomic_directory(out, force=force, source=bundle) as tmp:
        (tmp / name / "1").mkdir(parents=True)
        shutil.copy2(model_path, tmp / name / "1" / "model.onnx")
        (tmp / name / "config.pbtxt").write_text(text)
        (tmp / MANIFEST_NAME).write_text(json.dumps(repository_record(tmp, str(bundle)), indent=2))
    return Path(out), name, notes
