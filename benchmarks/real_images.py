"""Precisions judged on real images, recipe against recipe: the figures in docs/precisions.md.

    python benchmarks/real_images.py BUNDLE --precision int8,int8-static,int4 \\
        [--calib DIR|photos|digits] [--eval DIR|photos] [--out DIR] [--markdown table.md]

For each precision, two recipes: "before" (what `quantize` wrote before real images judged
it: no smoothing, static int8 calibrated at the deploy size only, minmax) and "now" (the
defaults: smoothing chosen on the calibration images, calibration at every size judged).
Both are judged by the same evaluator (precisions.Evaluator: the real images at the sizes
it measures, seeded noise beside them) and written to --out (model.<precision>.<recipe>.onnx),
so their latency can be timed as users run them, one engine per fresh process:

    python benchmarks/cpu_vs_peers.py BUNDLE --res 224,448 --engines ort-file:before,ort-file:now \\
        --graph before=OUT/model.int8-static.before.onnx --graph now=OUT/model.int8-static.now.onnx
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np

from vit_deploy.reports.machine import cpu_name
from vit_deploy.precisions.photos import resolve
from vit_deploy.precisions.evaluate import Evaluator, calibration_batches, judged_resolutions
from vit_deploy.precisions.sensitivity import choose_smoothing
from vit_deploy.precisions.quantize import QuantOptions, quantize_model
from vit_deploy.runtime.manifest import load_manifest


def _before_calibration(manifest, calib_files) -> list[np.ndarray]:
    """What `quantize --calib` fed the calibrator before: each image once, at the bundle's
    deploy size."""
    from vit_deploy.data import load_digits_split
    from vit_deploy.runtime.preprocess import Preprocess

    pre = Preprocess.from_manifest(manifest, resize="shorter_side_center_crop")
    images = (list(load_digits_split()["train_images"][:64]) if calib_files == "digits"
              else list(calib_files)[:64])
    x = np.stack([pre(image) for image in images])
    return [x[i:i + 8] for i in range(0, len(x), 8)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--precision", default="int8,int8-static,int4")
    p.add_argument("--calib", default=None)
    p.add_argument("--eval", dest="eval_images", default=None)
    p.add_argument("--eval-set", default=None, choices=["digits"])
    p.add_argument("--out", type=Path, default=Path("real-images"))
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args()
    manifest = load_manifest(args.bundle)
    calib_files, judged = resolve(args.calib, args.eval_images)
    if args.eval_set == "digits" and args.eval_images is None:
        judged = None  # the evaluator takes the held-out digits
    now_calib = calibration_batches(manifest, calib_files)
    before_calib = _before_calibration(manifest, calib_files)
    evaluator = Evaluator(args.bundle, manifest, eval_set=args.eval_set, images=judged)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for precision in args.precision.split(","):
        for recipe in ("before", "now"):
            quant = QuantOptions()
            calibration = before_calib if recipe == "before" else now_calib
            if recipe == "now" and precision.startswith("int8"):
                quant, _ = choose_smoothing(evaluator, precision, quant, calibration, "auto",
                                            args.out, lambda _: None)
            path = args.out / f"model.{precision}.{recipe}.onnx"
            quantize_model(evaluator.reference, path, precision=precision, options=quant,
                           calibration=calibration)
            photos = evaluator.photos(path, precision)
            noise = evaluator.parity(path, precision)
            worst = min(photos, key=lambda c: c.cosine_min)
            tokens = [c.token_cosine_p1 for c in photos if c.token_cosine_p1 is not None]
            top1 = [c.top1_agree for c in photos if c.top1_agree is not None]
            rows.append([precision, recipe, "-" if quant.smooth is None else str(quant.smooth),
                         f"{worst.cosine_min:.5f} ({worst.label})",
                         f"{min(c.cosine_median for c in photos):.5f}",
                         f"{min(tokens):.5f}" if tokens else "-",
                         f"{min(top1):.1%}" if top1 else "-",
                         f"{min(c.cosine for c in noise.cases):.5f}",
                         "pass" if all(c.passed for c in photos) and noise else "FAIL"])
    head = ["precision", "recipe", "smoothing", "worst image cosine", "median",
            "tokens p1", "top-1 agreement", "noise cosine", "verdict"]
    sizes = ", ".join(f"{h}x{w}" for h, w in judged_resolutions(manifest))
    lines = [f"{args.bundle.name}: judged on {evaluator.images.source}, at {sizes}; "
             f"{cpu_name()} ({platform.machine()})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
