"""int8 on a *trained* SigLIP 2 NaFlex tower: the digits tower that ships with vit-deploy
(scripts/train_digits_naflex.py), exported with `export --naflex`, quantised with
`quantize --precision int8` (judged, as every NaFlex bundle, on the 12 shipped photographs
at their own aspect ratios and cropped), then measured on what it was trained for: the 359
held-out digits, each at its own aspect ratio (1:4 .. 4:1), classified by the shipped linear
head on the bundle's pooled output.

    python benchmarks/naflex_digits.py [--out DIR] [--json F]

Prints one JSON object: ORT fp32 vs transformers (pooled, relative), held-out accuracy per
precision (all and per ratio), pooled cosine int8 vs fp32 on the digits, and the quantize
verdict's cosines on the photographs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def classifier(tower_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    from safetensors.numpy import load_file

    head = load_file(str(tower_dir / "classifier.safetensors"))
    return head["weight"].astype(np.float64), head["bias"].astype(np.float64)


def pooled(bundle: Path, precision: str, images: list[np.ndarray]) -> np.ndarray:
    from vit_deploy.runtime.naflex.session import NaFlexSession

    with NaFlexSession(bundle, precision=precision) as s:
        return np.concatenate([s.pooled(images[i:i + 64]) for i in range(0, len(images), 64)])


def transformers_pooled(tower_dir: Path, bundle: Path, images: list[np.ndarray]) -> np.ndarray:
    import torch
    import transformers as T

    from vit_deploy.runtime.naflex.session import NaFlexSession

    model = T.Siglip2VisionModel.from_pretrained(tower_dir).eval()
    with NaFlexSession(bundle) as s:
        b = s.preprocess(images)
    with torch.no_grad():
        return model(pixel_values=torch.from_numpy(b.pixel_values),
                     pixel_attention_mask=torch.from_numpy(b.pixel_attention_mask),
                     spatial_shapes=torch.from_numpy(b.spatial_shapes)).pooler_output.numpy()


def measure(out: Path) -> dict:
    from vit_deploy.data import (DIGITS_NAFLEX_BUDGET, DIGITS_NAFLEX_DIR, data_path,
                                 load_digits_naflex)
    from vit_deploy.export.naflex.bundle import NaFlexBundleOptions, export_naflex_bundle
    from vit_deploy.precisions.add import add_precisions

    tower = data_path(DIGITS_NAFLEX_DIR)
    bundle = out / "digits-naflex"
    export_naflex_bundle(tower, bundle,
                         options=NaFlexBundleOptions(max_num_patches=DIGITS_NAFLEX_BUDGET))
    report = add_precisions(bundle, ["int8"])
    int8 = report.results[0]
    split = load_digits_naflex()
    images, labels = split["test_images"], split["test_labels"]
    ratios = np.asarray(split["test_ratios"])
    w, b = classifier(tower)
    feats = {p: pooled(bundle, p, images) for p in ("fp32", "int8")}
    hf = transformers_pooled(tower, bundle, images)
    rel = float(np.abs(feats["fp32"] - hf).max() / np.abs(hf).max())
    right = {p: (f.astype(np.float64) @ w.T + b).argmax(1) == labels for p, f in feats.items()}
    f, q = (feats[p].astype(np.float64) for p in ("fp32", "int8"))
    cos = (f * q).sum(1) / (np.linalg.norm(f, axis=1) * np.linalg.norm(q, axis=1))
    return {
        "weights": "digits SigLIP 2 NaFlex tower shipped with vit-deploy (trained)",
        "inputs": f"{len(labels)} held-out digits, each at its own aspect ratio (1:4 .. 4:1); "
                  "the int8 verdict: the 12 shipped photographs",
        "ort_fp32_vs_transformers_max_rel": rel,
        "accuracy": {p: float(r.mean()) for p, r in right.items()},
        "accuracy_per_ratio": {f"{r:.3g}": {p: float(v[ratios == r].mean())
                                            for p, v in right.items()}
                               for r in sorted(set(ratios.tolist()))},
        "digits_pooled_cosine_int8": {"min": float(cos.min()), "median": float(np.median(cos))},
        "int8_passed": bool(int8.passed),
        "photos_cosine_min": {o: min(float(c.cosine_min) for c in int8.photos if c.output == o)
                              for o in dict.fromkeys(c.output for c in int8.photos)},
        "photos_floor": {c.output: float(c.floor) for c in int8.photos},
        "photos_cases": len(int8.photos),
        "int8_bytes": int8.size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where the bundle goes "
                        "(default: a temporary directory)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args.out or Path(tmp))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
