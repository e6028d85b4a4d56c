"""A bundle's precisions on photographs it has never seen, against what `quantize` predicted:
the figures behind docs/precisions.md's out-of-sample rows.

    python benchmarks/out_of_sample.py BUNDLE DIR [--precision int8,int8-static,fp16] \\
        [--res 224,336x504,518] [--markdown table.md]

DIR: photographs that neither the package nor the calibration contains (each judged whole).
For each precision in BUNDLE and each size: the worst image's cosine to the bundle's fp32
model (pooled and the whole patch grid), the 1st percentile of per-token cosine, the share of
each image's 5 nearest neighbours (pooled, cosine, within DIR) kept, and, where `quantize`
judged that size and output, the worst image it expected on as many other photographs
(manifest: real_images.cases[].expected_worst) and whether the figure here holds it. CPU
provider; torch-free.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import vit_deploy  # noqa: F401  (first: ONNX Runtime's telemetry is off before it loads)
from vit_deploy.precisions.evaluate import _run_batched
from vit_deploy.precisions.photos import EvalImages, fp32_photo_batches, image_files, judge_photos
from vit_deploy.reports.machine import cpu_name
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.session import ViTSession
from vit_deploy.runtime.sizes import format_resolution, parse_resolution


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("photos", type=Path)
    p.add_argument("--precision", default=None, help="default: every precision but fp32")
    p.add_argument("--res", default=None, help="sizes, e.g. 224,336x504 (default: judged)")
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args()
    manifest = load_manifest(args.bundle)
    precisions = (args.precision.split(",") if args.precision else
                  [q for q in manifest.models if q != "fp32"])
    files = image_files(args.photos, "photos")
    images = EvalImages(tuple(files), f"{len(files)} photographs in {args.photos}", crops=False)
    sizes = ([parse_resolution(r) for r in args.res.split(",")] if args.res else
             [tuple(c["resolution"]) for c in
              manifest.precisions[precisions[0]]["real_images"]["cases"]][::2])
    batches = fp32_photo_batches(args.bundle, manifest, sizes, images)
    head = ["precision", "size", "output", "worst image", "expected by quantize", "holds",
            "tokens p1", "5-NN kept (worst)"]
    rows = []
    for precision in precisions:
        judged = {(tuple(c["resolution"]), c["output"]): c for c in
                  manifest.precisions[precision].get("real_images", {}).get("cases", [])}
        with ViTSession(manifest.model_path(args.bundle, precision), provider="cpu") as s:
            for hw, (x, ref) in batches.items():
                out = _run_batched(s, x)
                for c in judge_photos(ref, out, resolution=hw, precision=precision,
                                      labels=images.labels()):
                    predicted = judged.get((tuple(hw), c.output), {}).get("expected_worst")
                    rows.append([precision, format_resolution(hw), c.output,
                                 f"{c.cosine_min:.5f} ({c.worst_image})",
                                 "-" if predicted is None else f"{predicted:.5f}",
                                 "-" if predicted is None else
                                 ("yes" if c.cosine_min >= predicted else "NO"),
                                 "-" if c.token_cosine_p1 is None else f"{c.token_cosine_p1:.5f}",
                                 "-" if c.neighbours_kept is None else
                                 f"{c.neighbours_kept:.1%} ({round(c.neighbours_worst * 5)}/5)"])
    lines = [f"{args.bundle.name}: {images.source}, each whole; {cpu_name()} "
             f"({platform.machine()}), CPU provider", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
