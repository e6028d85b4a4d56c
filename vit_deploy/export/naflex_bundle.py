"""A SigLIP 2 checkpoint (or model) -> a NaFlex folder: model.onnx (its metadata says NaFlex
inputs and holds the config), written only once ONNX Runtime reproduces PyTorch on mixed
batches of aspect ratios. runtime/naflex_session.py opens the folder.

Not (yet) a bundle of the manifest's kind: check / bench / serve / quantize / the web runtime
read NCHW bundles only, so this folder has no manifest.json they would misread.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from vit_deploy.export.model import ViT
from vit_deploy.export.naflex import NaFlexViT, example_inputs, export_naflex_onnx
from vit_deploy.parity import ParityError, ParityReport, judge
from vit_deploy.progress import Progress, silent
from vit_deploy.runtime.contract import MODEL_FILE, OPSET
from vit_deploy.runtime.naflex import NAFLEX_INPUTS, NAFLEX_OUTPUTS

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


def export_naflex(src: ViT | str | Path, dst: str | Path, *, opset: int = OPSET,
                  progress: Progress = silent) -> NaFlexExport:
    """`src` (a model, or a checkpoint: a Siglip2VisionModel save_pretrained folder, ...)
    -> `dst`/model.onnx. ParityError (nothing written) when ONNX Runtime and PyTorch differ
    beyond the fp32 policy on any case of PARITY_CASES."""
    if isinstance(src, ViT):
        model = src.eval()
    else:
        from vit_deploy.export.checkpoints import CheckpointWarning, load_any

        progress(f"loading {src}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointWarning)
            model, _ = load_any(src)
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
