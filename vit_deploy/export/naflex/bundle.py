"""A SigLIP 2 checkpoint (or model) -> a NaFlex graph judged against PyTorch before it is
written: `export_naflex` writes the bare model.onnx (its metadata says NaFlex inputs and holds
the config); `export_naflex_bundle` writes a bundle (manifest.json saying NaFlex inputs and
the patch budget, model.onnx, the weights, golden references on images of six aspect ratios),
atomically, with the bundle writer's ownership and clobber guard (atomic.py).
runtime/naflex/session.py opens either.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from vit_deploy.atomic import atomic_directory
from vit_deploy.export.bundle import versions
from vit_deploy.export.checkpoints import save_weights
from vit_deploy.export.model import ViT
from vit_deploy.export.naflex.model import NaFlexViT, example_inputs, export_naflex_onnx
from vit_deploy.parity import ParityError, ParityReport, judge
from vit_deploy.progress import Progress, silent
from vit_deploy.runtime.contract import MODEL_FILE, OPSET
from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError
from vit_deploy.runtime.contract import WEIGHTS_FILE, WEIGHTS_ROLE, model_role
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.manifest_parts import FileEntry, IOSpec, PreprocessSpec, TensorSpec
from vit_deploy.runtime.naflex.contract import (ATTENTION_MASK, BATCH_DIM, MAX_NUM_PATCHES,
                                                NAFLEX_INPUTS, NAFLEX_LAYOUT, NAFLEX_OUTPUTS,
                                                NAFLEX_RESIZE, PATCHES_DIM, PIXEL_VALUES,
                                                SPATIAL_SHAPES)
from vit_deploy.runtime.naflex.preprocess import NaFlexPreprocess
from vit_deploy.runtime.naflex.references import (REFERENCE_CASES, NaFlexReferences,
                                                  pack_naflex, reference_image)
from vit_deploy.runtime.references import REFERENCES_FILE, REFERENCES_ROLE
from vit_deploy.runtime.sizes import guard_tokens

# Batches the export is judged on: (number of patches, each image's grid): one square, a
# mixed batch of aspect ratios 1:16 .. 16:1 (up- and down-sampled table), tiny grids.
PARITY_CASES = ((256, ((16, 16),)),
                (256, ((4, 64), (64, 4), (9, 28), (15, 15))),
                (7, ((1, 1), (2, 3), (1, 7))))


@dataclass(frozen=True)
class NaFlexExport:
    """What export_naflex wrote, and the parity it was judged on (renders itself)."""

    path: Path
    report: ParityReport

    def __str__(self) -> str:
        return f"{self.path}\n{self.report}"

    def __rich__(self) -> object:
        return self.report.__rich__()


def load_naflex_model(src: ViT | str | Path, progress: Progress = silent) -> ViT:
    """A model, or a checkpoint (a Siglip2VisionModel save_pretrained folder, ...) loaded."""
    if isinstance(src, ViT):
        return src.eval()
    from vit_deploy.export.checkpoints import CheckpointWarning, load_any

    progress(f"loading {src}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        return load_any(src)[0].eval()


class NaFlexCheckpointError(VitDeployError, ValueError):
    """A checkpoint NaFlex cannot run (not a SigLIP 2 tower): says what it is."""

    exit_code = BAD_INPUT


def siglip2_checkpoint(path: str | Path, *, source: str = "auto") -> ViT:
    """The model of a SigLIP 2 checkpoint; NaFlexCheckpointError for any other (a Hugging
    Face directory whose model_type is not siglip2's, or a tower NaFlex cannot run)."""
    path = Path(path)
    config = path / "config.json"
    if path.is_dir() and config.is_file():
        try:
            kind = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            kind = None
        if not (isinstance(kind, str) and kind.startswith("siglip2")):
            raise NaFlexCheckpointError(f"--naflex needs a SigLIP 2 checkpoint; {str(path)!r} "
                                        f"has model_type {kind!r} (expected siglip2 or "
                                        f"siglip2_vision_model)")
    from vit_deploy.export.checkpoints import CheckpointWarning, load_any

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        model = load_any(path, source=source)[0].eval()
    try:
        NaFlexViT(model)
    except ValueError as e:
        raise NaFlexCheckpointError(f"--naflex: {str(path)!r} is not a SigLIP 2 tower: "
                                    f"{e}") from None
    return model


def export_naflex(src: ViT | str | Path, dst: str | Path, *, opset: int = OPSET,
                  progress: Progress = silent) -> NaFlexExport:
    """`src` (a model, or a checkpoint: a Siglip2VisionModel save_pretrained folder, ...)
    -> `dst`/model.onnx. ParityError (nothing written) when ONNX Runtime and PyTorch differ
    beyond the fp32 policy on any case of PARITY_CASES."""
    model = load_naflex_model(src, progress)
    reference = NaFlexViT(model).eval()  # refuses what NaFlex cannot run, before exporting
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst, prefix=".naflex-") as tmp:
        progress("exporting the NaFlex graph")
        staged = export_naflex_onnx(model, Path(tmp) / MODEL_FILE, opset=opset)
        progress("parity: ONNX Runtime against PyTorch")
        report = parity(reference, staged)
        if not report:
            raise ParityError(report)
        os.replace(staged, dst / MODEL_FILE)
    return NaFlexExport(dst / MODEL_FILE, report)


def parity(reference: NaFlexViT, path: Path) -> ParityReport:
    """ONNX Runtime (CPU) on `path` against `reference` on PARITY_CASES, each output judged
    by the fp32 policy; last_hidden_state at the real positions only."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cfg, P = reference.vit.cfg, reference.vit.cfg.patch_size
    report = ParityReport()
    for n, grids in PARITY_CASES:
        inputs = example_inputs(cfg, batch=len(grids), patches=n, grids=grids)
        with torch.no_grad():
            want = [t.numpy() for t in reference(*inputs)]
        got = session.run(None, dict(zip(NAFLEX_INPUTS, (t.numpy() for t in inputs))))
        real = inputs[1].numpy()[..., None].astype(np.float32)  # (B, N, 1)
        label = "naflex " + ",".join(f"{h}x{w}" for h, w in grids) + f" of {n}"
        for name, w, g in zip(NAFLEX_OUTPUTS, want, got):
            if w.ndim == 3:  # (B, N, D): padding rows are not outputs
                w, g = w * real, g * real
            case = judge(w, g, resolution=(grids[0][0] * P, grids[0][1] * P),
                         provider="cpu", output=name)
            report.cases.append(replace(case, case=label))
    return report


@dataclass(frozen=True, kw_only=True)
class NaFlexBundleOptions:
    max_num_patches: int = MAX_NUM_PATCHES  # each image's patch budget (the processor's)
    mean: tuple[float, ...] | None = None  # None: the config's (the checkpoint's own, if read)
    std: tuple[float, ...] | None = None
    opset: int = OPSET
    force: bool = False  # write into an output vit-deploy did not write
    source: dict | None = None  # where the weights came from (the export record)


def export_naflex_bundle(src: ViT | str | Path, out: str | Path, *,
                         options: NaFlexBundleOptions = NaFlexBundleOptions(),
                         progress: Progress = silent) -> NaFlexExport:
    """`src` -> a NaFlex bundle at `out`, atomically: nothing is written unless ONNX Runtime
    matches PyTorch on every PARITY_CASES batch (ParityError). Golden references: PyTorch's
    outputs on REFERENCE_CASES' images, preprocessed by the bundle's own rule."""
    start = time.perf_counter()
    model = load_naflex_model(src, progress)
    reference = NaFlexViT(model).eval()  # refuses what NaFlex cannot run, before exporting
    cfg = model.cfg
    pre = NaFlexPreprocess(patch_size=cfg.patch_size, max_num_patches=options.max_num_patches,
                           mean=options.mean or cfg.mean, std=options.std or cfg.std)
    # the golden references run at the budget: one whose attention cannot fit is refused
    # before anything is written (65,536 patches once ran out of memory mid-export)
    guard_tokens(options.max_num_patches, cfg, what=f"max_num_patches {options.max_num_patches}",
                 advice="a smaller --max-patches", override=None)
    with atomic_directory(out, force=options.force) as tmp:
        progress("exporting the NaFlex graph")
        export_naflex_onnx(model, tmp / MODEL_FILE, opset=options.opset)
        export_seconds = time.perf_counter() - start
        progress("parity: ONNX Runtime against PyTorch")
        report = parity(reference, tmp / MODEL_FILE)
        if not report:
            raise ParityError(report)
        save_weights(model, tmp / WEIGHTS_FILE)
        progress("storing the golden references (PyTorch fp32, six aspect ratios)")
        refs = naflex_references(reference, pre, tmp)
        files = {name: FileEntry.of(tmp / name, role) for name, role in (
            (MODEL_FILE, model_role("fp32")), (WEIGHTS_FILE, WEIGHTS_ROLE),
            (refs.file, REFERENCES_ROLE))}
        manifest = Manifest(
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            config=cfg, preprocess=naflex_preprocess_spec(cfg, pre), io=naflex_io(cfg),
            models={"fp32": MODEL_FILE}, files=files, naflex_references=refs,
            export={"opset": options.opset, "naflex": True,
                    "max_num_patches": options.max_num_patches,
                    "export_s": round(export_seconds, 2),
                    "total_s": round(time.perf_counter() - start, 2),
                    **({"source": options.source} if options.source else {})},
            parity=report.to_dict(), versions=versions())
        manifest.save(tmp)
    return NaFlexExport(Path(out), report)


def naflex_io(cfg) -> IOSpec:
    """The bundle's inputs and outputs: NaFlex's three inputs, pooled and the tokens."""
    depth = cfg.in_chans * cfg.patch_size ** 2
    return IOSpec(
        inputs=(TensorSpec(PIXEL_VALUES, "float32", (BATCH_DIM, PATCHES_DIM, depth)),
                TensorSpec(ATTENTION_MASK, "int32", (BATCH_DIM, PATCHES_DIM)),
                TensorSpec(SPATIAL_SHAPES, "int64", (BATCH_DIM, 2))),
        outputs=(TensorSpec(NAFLEX_OUTPUTS[0], "float32", (BATCH_DIM, cfg.width)),
                 TensorSpec(NAFLEX_OUTPUTS[1], "float32", (BATCH_DIM, PATCHES_DIM, cfg.width))),
        dynamic=True, patch_size=cfg.patch_size,
        dim_rule=f"{PATCHES_DIM} >= each image's gh*gw patches of {cfg.patch_size}; "
                 f"{SPATIAL_SHAPES} (gh, gw) per image")


def naflex_preprocess_spec(cfg, pre: NaFlexPreprocess) -> PreprocessSpec:
    return PreprocessSpec(resolution=tuple(cfg.img_size), mean=tuple(pre.mean),
                          std=tuple(pre.std), resize=NAFLEX_RESIZE, interpolation="bilinear",
                          scale=pre.scale, layout=NAFLEX_LAYOUT,
                          max_num_patches=pre.max_num_patches)


def naflex_forward(reference: NaFlexViT, pre: NaFlexPreprocess, images) -> dict[str, np.ndarray]:
    """PyTorch fp32 on images preprocessed by `pre`: pooled, and last_hidden_state with
    its padding rows zeroed (they are not outputs)."""
    batch = pre(images)
    with torch.no_grad():
        pooled, last = (t.numpy() for t in reference(*(torch.from_numpy(a) for a in batch)))
    return dict(zip(NAFLEX_OUTPUTS, (pooled, last * batch.pixel_attention_mask[..., None])))


def naflex_references(reference: NaFlexViT, pre: NaFlexPreprocess, root: Path
                      ) -> NaFlexReferences:
    """REFERENCE_CASES run in PyTorch, written to root/references.bin."""
    from vit_deploy.export.references import source

    cases = [(name, images, naflex_forward(
        reference, pre, [reference_image(seed, hw) for seed, hw in images]))
        for name, images in REFERENCE_CASES]
    refs, data = pack_naflex(cases, file=REFERENCES_FILE, source=source())
    (root / refs.file).write_bytes(data)
    return refs
