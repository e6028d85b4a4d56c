"""The export pipeline: model -> ONNX -> onnxsim -> parity -> bundle directory (atomic)."""

from __future__ import annotations

import datetime as dt
import json
import platform
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any


from vit_deploy.atomic import atomic_directory
from vit_deploy.contract import (BATCH_DIM, BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, FEATURES_NAME,
                                 HEIGHT_DIM, INPUT_NAME, LOGITS_NAME, MANIFEST_NAME, MODEL_FILE,
                                 OPSET, WEIGHTS_FILE, WIDTH_DIM)
from vit_deploy.export.checkpoints import save_weights
from vit_deploy.export.onnx import ExportError, OnnxOptions, export_onnx, node_count
from vit_deploy.export.simplify import simplify_onnx
from vit_deploy.export.model import ViT, numpy_forward
from vit_deploy.parity import ParityCase, ParityError, ParityReport, batch_independence, judge, sample_inputs
from vit_deploy.runtime.manifest import file_entry
from vit_deploy.runtime.providers import short_name
from vit_deploy.runtime.session import ViTSession
from vit_deploy.sizes import check_input_size

PARITY_BATCHES = (1, 3)


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    resolution: tuple[int, int] | None = None  # deploy resolution; None: the native one
    static: bool = False  # freeze `resolution` into the graph
    simplify: bool = True
    opset: int = OPSET
    features: bool = False  # also output the pooled features
    force: bool = False  # replace an output that is not a bundle
    labels: tuple[str, ...] | None = None  # class names, one per class, if known


@dataclass
class ExportResult:
    path: Path
    manifest: dict[str, Any]
    report: ParityReport
    seconds: float
    notes: list[str] = field(default_factory=list)


def parity_resolutions(model: ViT, resolution: tuple[int, int], static: bool) -> list[tuple[int, int]]:
    """The requested size, the native one, a non-square one, the smallest grid, odd sides."""
    if static:
        return [resolution]
    P = model.cfg.patch_size
    grids = [model.cfg.grid_size, (20, 30), (1, 1), (7, 9), (2, 4)]
    out = [resolution]
    for gh, gw in grids:
        hw = (P * gh, P * gw)
        if hw not in out:
            out.append(hw)
    return out


def export_bundle(model: ViT, out: str | Path, *, options: ExportOptions = ExportOptions()) -> ExportResult:
    """Export, simplify, verify and write a bundle to `out`, atomically.

    Raises ParityError (with the full report) when any case fails; `out` is then
    left as it was.
    """
    start = time.perf_counter()
    cfg = model.cfg
    resolution = options.resolution or cfg.img_size
    check_input_size(*resolution, cfg.patch_size)
    if options.labels is not None and len(options.labels) != cfg.num_classes:
        raise ValueError(f"{len(options.labels)} labels given for {cfg.num_classes} classes")
    model = model.eval()
    notes: list[str] = []
    with atomic_directory(out, force=options.force) as tmp:
        raw = tmp / "model.raw.onnx"
        export_onnx(model, raw, options=OnnxOptions(
            opset=options.opset, features=options.features,
            static_resolution=resolution if options.static else None))
        export_seconds = time.perf_counter() - start
        cases = [(hw, b) for hw in parity_resolutions(model, resolution, options.static)
                 for b in PARITY_BATCHES]
        inputs = {case: sample_inputs(case[0], case[1], channels=cfg.in_chans) for case in cases}
        forward = numpy_forward(model)
        refs = {case: forward(x) for case, x in inputs.items()}

        nodes_raw = node_count(raw)
        chosen, nodes, report = raw, nodes_raw, None
        simplify_info: dict[str, Any] = {"requested": options.simplify, "kept": False,
                                         "nodes_before": nodes_raw}
        if options.simplify:
            sim = tmp / "model.sim.onnx"
            try:
                simplify_onnx(raw, sim)
                nodes_sim = node_count(sim)
                simplify_info["nodes_after"] = nodes_sim
                if nodes_sim > nodes_raw:
                    notes.append(f"onnxsim result discarded: it grew the graph "
                                 f"{nodes_raw} -> {nodes_sim} nodes")
                else:
                    report = _verify(model, sim, inputs, refs)
                    if report:
                        chosen, nodes = sim, nodes_sim
                        simplify_info["kept"] = True
                    else:
                        notes.append("onnxsim result discarded: it failed parity")
                        report = None
            except ExportError as e:
                notes.append(f"onnxsim result discarded: {e}")
        if report is None:
            report = _verify(model, raw, inputs, refs)
        if not report:
            raise ParityError(report)

        final = tmp / MODEL_FILE
        chosen.rename(final)
        for leftover in (tmp / "model.raw.onnx", tmp / "model.sim.onnx"):
            leftover.unlink(missing_ok=True)
        save_weights(model, tmp / WEIGHTS_FILE)
        seconds = time.perf_counter() - start
        manifest = build_manifest(model, tmp, options=options, resolution=resolution,
                                  report=report, simplify_info=simplify_info, nodes=nodes,
                                  timings={"export_s": round(export_seconds, 2),
                                           "total_s": round(seconds, 2)}, notes=notes)
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return ExportResult(path=Path(out), manifest=manifest, report=report, seconds=seconds, notes=notes)


def _verify(model: ViT, path: Path, inputs: dict, refs: dict) -> ParityReport:
    """ORT (CPU) against PyTorch on every case, and batch independence on both."""
    with ViTSession(path, provider="cpu") as session:
        provider = short_name(session.providers[0])
        cases: list[ParityCase] = [
            judge(refs[case], session.run(x), resolution=case[0], provider=provider)
            for case, x in inputs.items()]
        res = next(iter(inputs))[0]
        checks = [batch_independence(numpy_forward(model), res, subject="pytorch",
                                     channels=model.cfg.in_chans),
                  batch_independence(session.run, res, subject=f"onnxruntime:{provider}",
                                     channels=model.cfg.in_chans)]
    return ParityReport(cases=cases, checks=checks)


def build_manifest(model: ViT, root: Path, *, options: ExportOptions, resolution: tuple[int, int],
                   report: ParityReport, simplify_info: dict[str, Any], nodes: int,
                   timings: dict[str, float],
                   notes: list[str]) -> dict[str, Any]:
    cfg = model.cfg
    labels = list(options.labels) if options.labels else None
    h_dim, w_dim = (resolution if options.static else (HEIGHT_DIM, WIDTH_DIM))
    outputs = [{"name": LOGITS_NAME, "dtype": "float32", "shape": [BATCH_DIM, cfg.num_classes]}]
    if not cfg.num_classes:  # a backbone without a head: its output is the pooled features
        outputs = [{"name": FEATURES_NAME, "dtype": "float32", "shape": [BATCH_DIM, cfg.width]}]
    elif options.features:
        outputs.append({"name": FEATURES_NAME, "dtype": "float32", "shape": [BATCH_DIM, cfg.width]})
    return {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_FORMAT_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_dict(),
        "preprocess": {
            "resize": "shorter_side_center_crop",
            "resolution": list(resolution),
            "interpolation": "bicubic",
            "mean": list(cfg.mean),
            "std": list(cfg.std),
            "scale": 1 / 255,
            "color": "RGB",
            "layout": "NCHW",
        },
        "io": {
            "inputs": [{"name": INPUT_NAME, "dtype": "float32",
                        "shape": [BATCH_DIM, cfg.in_chans, h_dim, w_dim]}],
            "outputs": outputs,
            "dynamic": not options.static,
            "patch_size": cfg.patch_size,
            "dim_rule": None if options.static else
            f"{HEIGHT_DIM} and {WIDTH_DIM} are positive multiples of {cfg.patch_size}",
        },
        "labels": labels,
        "models": {"fp32": MODEL_FILE},
        "files": {name: file_entry(root / name) | {"role": role}
                  for name, role in ((MODEL_FILE, "model:fp32"), (WEIGHTS_FILE, "weights"))},
        "export": {"opset": options.opset, "static": options.static, "simplify": simplify_info,
                   "nodes": nodes, **timings, "notes": notes},
        "parity": report.to_dict(),
        "versions": versions(),
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("vit-deploy", "torch", "onnx", "onnxruntime-gpu", "onnxruntime", "onnxscript",
                 "onnxsim", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


