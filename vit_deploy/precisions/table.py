"""The quantize report's table and lines (PrecisionsReport.__rich__): what each precision
measured on the real images, how far that carries to other photographs, and what was
written. Torch-free.
"""

from __future__ import annotations

from typing import Any

from vit_deploy.precisions.agreement import CONFIDENCE, MIN_PHOTOGRAPHS
from vit_deploy.runtime.sizes import format_resolution


def precisions_table(report: Any) -> Any:
    """A rich renderable of `report` (a precisions.add.PrecisionsReport)."""
    from rich.console import Group
    from rich.filesize import decimal
    from rich.table import Table

    table = Table("precision", "file", "size", "cos min (median)", "expected", "tok p1",
                  "max|Δ|", "top-1 (5)", "5-NN kept", "noise cos", "accuracy", "result",
                  title="precisions vs fp32, on real images (noise cos: beside them)",
                  title_justify="left")
    for r in report.results:
        acc, worst = r.accuracy, r.worst_photo
        tokens = [c.token_cosine_p1 for c in r.photos if c.token_cosine_p1 is not None]
        top1 = [c.top1_agree for c in r.photos if c.top1_agree is not None]
        top5 = [c.top5_agree for c in r.photos if c.top5_agree is not None]
        expected = [c.expected_worst for c in r.photos if c.expected_worst is not None]
        kept = [c for c in r.photos if c.neighbours_kept is not None]
        table.add_row(r.precision, r.file,
                      f"{decimal(r.size)} ({r.size / max(1, report.fp32_size):.1%})",
                      f"{worst.cosine_min:.5f} ({worst.cosine_median:.5f})" if worst else "-",
                      f">= {min(expected):.4f}" if expected else "-",
                      f"{min(tokens):.5f}" if tokens else "-",
                      f"{max(c.max_abs for c in r.photos):.2e}" if r.photos else "-",
                      (f"{min(top1):.0%}" + (f" ({min(top5):.0%})" if top5 else ""))
                      if top1 else "-",
                      f"{min(c.neighbours_kept for c in kept):.1%} (worst "
                      f"{round(min(c.neighbours_worst for c in kept) * 5)}/5)" if kept else "-",
                      f"{min(c.cosine for c in r.parity.cases):.5f}",
                      f"{acc['top1']}% (fp32 {acc['fp32_top1']}%)" if acc else "-",
                      "ok" if r.passed else ("FAIL, written (--force)" if report.force else
                                             "FAIL, not written"))
    judged = {r.judged_on for r in report.results if r.judged_on}
    lines: list[Any] = [table]
    sizes = sorted({format_resolution(c.resolution) for r in report.results for c in r.photos})
    counts = sorted({(c.photographs, c.images) for r in report.results for c in r.photos
                     if c.photographs is not None})
    lines += [f"judged on {j}, at {', '.join(sizes)}"
              + "".join(f" ({n} photographs, {v} images a size)" for n, v in counts)
              + ": cos: per image, its whole output; expected: the worst image "
              f"expected on as many other photographs ({CONFIDENCE:.0%}, from the spread "
              "between these); tok p1: 1st percentile of per-token cosine; top-1 (5): "
              "same class (share of fp32's top 5 kept); 5-NN kept: of each image's 5 "
              "nearest neighbours by the embedding, the share kept (mean; the image "
              "keeping fewest); noise cos: seeded N(0,1) pixels"
              for j in sorted(judged)]
    thin = sorted({c.photographs for r in report.results for c in r.photos
                   if c.photographs is not None and c.photographs < MIN_PHOTOGRAPHS})
    if thin:
        lines.append(f"[yellow]judged on only {', '.join(map(str, thin))} photograph(s): "
                     f"under {MIN_PHOTOGRAPHS} the worst-image figure says little of "
                     f"other photographs (--eval DIR with more)[/]")
    for r in report.results:
        if r.worst_photo is not None and r.worst_photo.worst_image:
            w = r.worst_photo
            lines.append(f"{r.precision}: worst image {w.worst_image} at {w.label}: "
                         f"{w.cosine_min:.5f}")
    for r in report.results:
        lines += [f"{r.precision}: {note}" for note in r.notes]
        if r.recipe.get("sensitivity"):
            kept = [x["layer"] for x in r.recipe["sensitivity"]["ranking"]
                    if x.get("kept_float")]
            lines.append(f"{r.precision}: kept float by sensitivity: {kept or 'none'}")
    if report.failed:
        lines.append(f"[red]{', '.join(report.failed)} failed the tolerance policy"
                     f"{' (written anyway: --force)' if report.force else ' and were not written'}[/]"
                     + (f"; {', '.join(report.passed)} passed and were written (exit code 3:"
                        f" some written, some not)" if report.passed else ""))
    return Group(*lines)
