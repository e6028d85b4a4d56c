"""Beyond one process: a Triton Inference Server model repository.

We do not write a distributed server: this emits what NVIDIA Triton's ONNX Runtime
backend needs. The single-machine HTTP server is `vit_deploy.server`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from vit_deploy.atomic import atomic_directory
from vit_deploy.contract import FEATURES_NAME, INPUT_NAME, LOGITS_NAME
from vit_deploy.runtime.manifest import load_manifest

KINDS = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}


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


def triton_config(manifest: dict[str, Any], *, name: str, precision: str, max_batch: int,
                  instances: list[tuple[str, int]], dynamic_batching_us: int | None,
                  accelerator: str | None) -> str:
    """config.pbtxt text for the onnxruntime_onnx platform."""
    io = manifest["io"]
    cfg = manifest["config"]
    dims = "[ %d, -1, -1 ]" % cfg["in_chans"] if io["dynamic"] else "[ %d, %d, %d ]" % (
        cfg["in_chans"], *manifest["preprocess"]["resolution"])
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch}",
             "input [", "  {", f'    name: "{INPUT_NAME}"', "    data_type: TYPE_FP32",
             f"    dims: {dims}", "  }", "]", "output ["]
    outputs = [o for o in io["outputs"] if o["name"] in (LOGITS_NAME, FEATURES_NAME)]
    for i, o in enumerate(outputs):
        lines += ["  {", f'    name: "{o["name"]}"', "    data_type: TYPE_FP32",
                  f"    dims: [ {o['shape'][-1]} ]", "  }" + ("," if i < len(outputs) - 1 else "")]
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
                  f'  gpu_execution_accelerator : [ {{ name : "{trt}" {params}}} ]', "} }"]
    lines.append(f'parameters {{ key: "vit_deploy_precision" value: {{ string_value: "{precision}" }} }}')
    return "\n".join(lines) + "\n"


def triton_repository(bundle: str | Path, out: str | Path, *, precision: str = "fp32",
                      name: str | None = None, max_batch: int = 8,
                      instances: list[tuple[str, int]] = [("cpu", 1)],  # noqa: B006
                      dynamic_batching_us: int | None = 1000, accelerator: str | None = None,
                      force: bool = False) -> tuple[Path, list[str]]:
    """Write REPO/<name>/1/model.onnx and REPO/<name>/config.pbtxt; returns (repo, notes)."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    if precision not in manifest["models"]:
        raise ValueError(f"bundle has no {precision!r} model; it has {sorted(manifest['models'])}")
    if max_batch < 1:
        raise ValueError(f"max batch must be >= 1, got {max_batch}")
    name = name or bundle.name
    notes = []
    coupled = manifest.get("precisions", {}).get(precision, {}).get("recipe", {}).get("kind") \
        == "dynamic"
    if coupled and dynamic_batching_us is not None:
        notes.append(f"{precision} quantises activations per batch: Triton's dynamic batching "
                     f"would make a request's result depend on its batch-mates, so it is off")
        dynamic_batching_us = None
    text = triton_config(manifest, name=name, precision=precision, max_batch=max_batch,
                         instances=instances, dynamic_batching_us=dynamic_batching_us,
                         accelerator=accelerator)
    with atomic_directory(out, force=force) as tmp:
        (tmp / name / "1").mkdir(parents=True)
        shutil.copy2(bundle / manifest["models"][precision], tmp / name / "1" / "model.onnx")
        (tmp / name / "config.pbtxt").write_text(text)
        (tmp / "manifest.json").write_text(json.dumps({"format": "triton-repository",
                                                        "source_bundle": str(bundle)}))
    return Path(out), notes
