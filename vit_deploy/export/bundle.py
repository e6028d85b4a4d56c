"""The export pipeline: model -> ONNX -> onnxsim -> parity -> bundle directory (atomic)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import platform
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.atomic import atomic_directory
from vit_deploy.runtime.contract import (BATCH_DIM, HEIGHT_DIM, INPUT_NAME, MODEL_FILE, OPSET,
                                 WEIGHTS_FILE, WEIGHTS_ROLE, WIDTH_DIM, model_role)
from vit_deploy.export.checkpoints import save_weights
from vit_deploy.export.sources import SourcePreprocess
from vit_deploy.export.references import (budget, golden_references, photo_reference,
                                          reference_sizes, write_references)
from vit_deploy.export.onnx import ExportError, OnnxOptions, export_onnx, node_count
from vit_deploy.export.simplify import simplify_onnx
from vit_deploy.runtime.config import ViTConfig
from vit_deploy.export.model import ViT, numpy_forward, reference_model
from vit_deploy.outputs import OutputSelection, output_shape, select_outputs
from vit_deploy.parity import ParityError, ParityReport, batch_independence, compare, sample_inputs
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.manifest_parts import FileEntry, IOSpec, PreprocessSpec, TensorSpec
from vit_deploy.runtime.references import REFERENCES_ROLE, References
from vit_deploy.runtime.providers import short_name
from vit_deploy.runtime.purpose import Purpose
from vit_deploy.runtime.session import ViTSession
from vit_deploy.progress import Progress, silent
from vit_deploy.runtime.sizes import format_resolution, guard_memory, require_patch_multiple

PARITY_BATCHES = (1, 3)


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    resolution: tuple[int, int] | None = None  # deploy resolution; None: the native one
    static: bool = False  # freeze `resolution` into the graph
    simplify: bool = True
    opset: int = OPSET
    features: bool = False  # also output the pooled features
    outputs: tuple[str, ...] | None = None  # None: the model's defaults (outputs.py)
    layers: tuple[int, ...] = ()  # also output the patch tokens after these blocks (1-based)
    layer_norm: bool = True  # pass those through the final norm (DINOv2's convention)
    force: bool = False  # replace an output that is not a bundle
    labels: tuple[str, ...] | None = None  # class names, one per class, if known
    probabilities: str = "softmax"  # how the logits are read (purpose; SigLIP zero-shot: sigmoid)
    allow_large: bool = False  # try sizes whose attention estimate exceeds available memory
    preprocess: SourcePreprocess | None = None  # the checkpoint's own; None: the config's mean/std
    source: dict[str, Any] | None = None  # where the weights came from (the export record)


@dataclass
class ExportResult:
    path: Path
    manifest: Manifest
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


def default_bundle_name(cfg: ViTConfig, resolution: tuple[int, int] | None = None) -> str:
    """vit-B16-448: the variant without its slash, and the deploy resolution."""
    hw = resolution or cfg.img_size
    res = str(hw[0]) if hw[0] == hw[1] else format_resolution(hw)
    return f"vit-{(cfg.name or 'model').replace('/', '')}-{res}"


def output_selection(cfg: ViTConfig, options: ExportOptions) -> OutputSelection:
    return select_outputs(cfg, options.outputs, layers=options.layers,
                          features=options.features, layer_norm=options.layer_norm)


def validate_request(cfg: ViTConfig, options: ExportOptions) -> tuple[int, int]:
    """The deploy resolution, after refusing what the export could not do: a size that is
    not a patch multiple, outputs the model does not have, labels that do not match the
    classes, parity batches whose attention would not fit in memory (the parity runs the
    largest batch in PyTorch and ONNX Runtime)."""
    output_selection(cfg, options)
    resolution = options.resolution or cfg.img_size
    require_patch_multiple(*resolution, cfg.patch_size)
    if options.labels is not None and len(options.labels) != cfg.num_classes:
        raise ValueError(f"{len(options.labels)} labels given for {cfg.num_classes} classes")
    if not options.allow_large:
        guard_memory(*resolution, cfg, batch=max(PARITY_BATCHES))
    return resolution


def export_bundle(model: ViT, out: str | Path, *, options: ExportOptions = ExportOptions(),
                  progress: Progress = silent) -> ExportResult:
    """Export, simplify, verify and write a bundle to `out`, atomically.

    Raises ParityError (with the full report) when any case fails; `out` is then
    left as it was. `progress` hears each step as it starts.
    """
    start = time.perf_counter()
    cfg = model.cfg
    resolution = validate_request(cfg, options)
    model = model.eval()
    selection = output_selection(cfg, options)
    notes: list[str] = []
    with atomic_directory(out, force=options.force) as tmp:
        raw = tmp / "model.raw.onnx"
        progress(f"tracing {cfg.name or 'the model'} with torch.onnx.export (dynamo)")
        export_onnx(model, raw, options=OnnxOptions(
            opset=options.opset, outputs=selection,
            static_resolution=resolution if options.static else None))
        export_seconds = time.perf_counter() - start
        cases = [(hw, b) for hw in parity_resolutions(model, resolution, options.static)
                 for b in PARITY_BATCHES]
        inputs = {case: sample_inputs(case[0], case[1], channels=cfg.in_chans) for case in cases}
        forward = numpy_forward(reference_model(model, selection))
        progress(f"running PyTorch on {len(inputs)} parity cases")
        refs = {case: forward(x) for case, x in inputs.items()}

        nodes_raw = node_count(raw)
        chosen, nodes, report = raw, nodes_raw, None
        simplify_info: dict[str, Any] = {"requested": options.simplify, "kept": False,
                                         "nodes_before": nodes_raw}
        if options.simplify:
            sim = tmp / "model.sim.onnx"
            try:
                progress("simplifying with onnxsim")
                simplify_onnx(raw, sim)
                nodes_sim = node_count(sim)
                simplify_info["nodes_after"] = nodes_sim
                if nodes_sim > nodes_raw:
                    notes.append(f"onnxsim result discarded: it grew the graph "
                                 f"{nodes_raw} -> {nodes_sim} nodes")
                else:
                    report = _verify(model, selection, sim, inputs, refs, progress)
                    if report:
                        chosen, nodes = sim, nodes_sim
                        simplify_info["kept"] = True
                    else:
                        notes.append("onnxsim result discarded: it failed parity")
                        report = None
            except ExportError as e:
                notes.append(f"onnxsim result discarded: {e}")
        if report is None:
            report = _verify(model, selection, raw, inputs, refs, progress)
        if not report:
            raise ParityError(report)

        final = tmp / MODEL_FILE
        chosen.rename(final)
        for leftover in (tmp / "model.raw.onnx", tmp / "model.sim.onnx"):
            leftover.unlink(missing_ok=True)
        progress(f"writing the bundle to {out}")
        save_weights(model, tmp / WEIGHTS_FILE)
        progress("storing the golden references (PyTorch fp32 on seeded inputs and two "
                 "real photographs)")
        bound = budget((tmp / MODEL_FILE).stat().st_size)
        ref_cases, ref_notes = golden_references(
            forward, reference_sizes(cfg, resolution, options.static), channels=cfg.in_chans,
            output_names=selection.names, budget_bytes=bound)
        photo_cases, pixels, photo_notes = photo_reference(
            forward, resolution, preprocess_spec(options, cfg, resolution),
            patch_size=cfg.patch_size, channels=cfg.in_chans, output_names=selection.names,
            budget_bytes=bound, used_bytes=sum(a.size * 4 for _, o in ref_cases
                                               for a in o.values()))
        notes += ref_notes + photo_notes
        ref_cases += photo_cases
        references = write_references(ref_cases, tmp, pixels=pixels) if ref_cases else None
        seconds = time.perf_counter() - start
        manifest = build_manifest(model, tmp, options=options, selection=selection,
                                  resolution=resolution, references=references,
                                  report=report, record={
                                      "simplify": simplify_info, "nodes": nodes,
                                      "export_s": round(export_seconds, 2),
                                      "total_s": round(seconds, 2), "notes": notes})
        manifest.save(tmp)
    return ExportResult(path=Path(out), manifest=manifest, report=report, seconds=seconds, notes=notes)


def _verify(model: ViT, selection: OutputSelection, path: Path, inputs: dict, refs: dict,
            progress: Progress = silent) -> ParityReport:
    """ORT (CPU) against PyTorch on every case and every output, and batch independence
    on both."""
    res = next(iter(inputs))[0]
    largest = (res, max(b for hw, b in inputs if hw == res))  # batch independence reuses it
    ran: dict = {}

    def run(x: np.ndarray):
        out = session.run_all(x)
        if (tuple(x.shape[2:]), len(x)) == largest:
            ran[largest] = out
        return out

    with ViTSession(path, provider="cpu") as session:
        provider = short_name(session.providers[0])
        cases = compare(run, list(refs.values()), list(inputs.values()),
                        precision="fp32", provider=provider, progress=progress)
        progress("batch independence on PyTorch and ONNX Runtime")
        x = inputs[largest]
        checks = [batch_independence(numpy_forward(reference_model(model, selection)), res,
                                     subject="pytorch", given=(x, refs[largest])),
                  batch_independence(session.run_all, res, subject=f"onnxruntime:{provider}",
                                     given=(x, ran[largest]))]
    return ParityReport(cases=cases, checks=checks)


def preprocess_spec(options: ExportOptions, cfg: Any, resolution: tuple[int, int]
                    ) -> PreprocessSpec:
    """The bundle's preprocessing: the checkpoint's own, else the config's mean / std."""
    return (options.preprocess.spec(resolution) if options.preprocess else
            PreprocessSpec(resolution=tuple(resolution), mean=cfg.mean, std=cfg.std))


def build_manifest(model: ViT, root: Path, *, options: ExportOptions,
                   selection: OutputSelection, resolution: tuple[int, int],
                   report: ParityReport, record: dict[str, Any],
                   references: References | None = None) -> Manifest:
    cfg = model.cfg
    h_dim, w_dim = (resolution if options.static else (HEIGHT_DIM, WIDTH_DIM))
    outputs = [TensorSpec(name, "float32",
                          output_shape(cfg, name, resolution if options.static else None))
               for name in selection.names]
    return Manifest(
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        config=cfg,
        preprocess=preprocess_spec(options, cfg, resolution),
        io=IOSpec(inputs=(TensorSpec(INPUT_NAME, "float32",
                                     (BATCH_DIM, cfg.in_chans, h_dim, w_dim)),),
                  outputs=tuple(outputs), dynamic=not options.static, patch_size=cfg.patch_size,
                  dim_rule=None if options.static else
                  f"{HEIGHT_DIM} and {WIDTH_DIM} are positive multiples of {cfg.patch_size}",
                  layer_norm=selection.layer_norm),
        labels=tuple(options.labels) if options.labels else None,
        purpose=dataclasses.replace(Purpose.of_outputs(outputs),
                                    probabilities=options.probabilities),
        models={"fp32": MODEL_FILE},
        files={MODEL_FILE: FileEntry.of(root / MODEL_FILE, model_role("fp32")),
               WEIGHTS_FILE: FileEntry.of(root / WEIGHTS_FILE, WEIGHTS_ROLE),
               **({references.file: FileEntry.of(root / references.file, REFERENCES_ROLE)}
                  if references else {})},
        references=references,
        export={"opset": options.opset, "static": options.static, **record,
                **({"source": options.source} if options.source else {})},
        parity=report.to_dict(),
        versions=versions(),
    )


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("vit-deploy", "torch", "onnx", "onnxruntime-gpu", "onnxruntime", "onnxscript",
                 "onnxsim", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out




def model_from_flags(model: str | None = None, *, patch: int | None = None,
                     native_res: tuple[int, int] | None = None, num_classes: int | None = None,
                     pos_embed: str = "learned", pool: str = "cls", seed: int = 0,
                     checkpoint: str | Path | None = None, source: str = "auto",
                     heads: int | None = None, merge: str | None = None
                     ) -> tuple[ViT, str | None]:
    """(model, checkpoint format) as the export command's flags describe: a seeded random
    model, or a checkpoint whose own config must not contradict a flag that was given. A
    --patch other than the checkpoint's resamples its patch embedding (PI-resize) and its
    position table to the new grid; `merge` (see config.parse_merge) adds token merging."""
    from vit_deploy.runtime.config import VARIANTS, config_from_flags, parse_merge, parse_variant
    from vit_deploy.export.checkpoints import CheckpointError, load_any
    from vit_deploy.export.model import build_model

    cfg = config_from_flags(model or "B", patch=patch, native_res=native_res, num_classes=num_classes,
                            pos_embed=pos_embed, pool=pool)
    if checkpoint is None:
        vit, fmt = build_model(cfg, seed=seed), None
        return (vit.with_merging(parse_merge(merge, cfg.depth)) if merge else vit), None
    vit, fmt = load_any(checkpoint, source=source, heads=heads, fallback_cfg=cfg)
    if model is not None:  # a size given beside a checkpoint must be the checkpoint's
        size, named_patch = parse_variant(model)
        shape = {k: getattr(vit.cfg, k) for k in VARIANTS[size]}
        if shape != VARIANTS[size]:
            raise CheckpointError(f"--model {model} ({_shape_text(VARIANTS[size])}) contradicts "
                                  f"the checkpoint ({_shape_text(shape)}); drop --model")
        patch = patch or named_patch  # as --patch: PI-resize to it
    for flag, given, loaded in (("--num-classes", num_classes, vit.cfg.num_classes),
                                ("--native-res", native_res, vit.cfg.img_size)):
        if given is not None and given != loaded:  # ints, or (H, W) tuples
            raise CheckpointError(f"{flag} {given} contradicts the checkpoint, which has "
                                  f"{loaded}; drop {flag}")
    if patch is not None and patch != vit.cfg.patch_size:  # FlexiViT: PI-resize the kernel
        vit = vit.with_patch_size(patch)
    if merge:
        vit = vit.with_merging(parse_merge(merge, vit.cfg.depth))
    return vit, fmt


def _shape_text(shape: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in shape.items())
