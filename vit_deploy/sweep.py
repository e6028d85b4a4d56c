"""`vit-deploy sweep`: the most accurate configuration that fits a latency budget.

Each configuration (patch size × token merging × precision) is exported from one
checkpoint (PI-resized kernel, ToMe in the graph, quantised as `quantize` does), scored
(held-out accuracy on the shipped digits for the trained test models, else the cosine of
its outputs to the unmerged model at the checkpoint's own patch size), and timed by
`vit-deploy bench`, each configuration alone in a fresh process, rounds interleaved.
torch is needed for the exports (imported when a sweep runs).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.runtime.files import write_bytes_atomic
from vit_deploy.progress import Progress, silent
from vit_deploy.runtime.manifest import dumps_strict
from vit_deploy.runtime.sizes import format_resolution

EVAL_IMAGES = 8  # random inputs for the cosine score when there is no labelled set


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    patches: tuple[int, ...] = ()  # () -> the checkpoint's own
    merges: tuple[str, ...] = ("0",)  # --merge-tokens specs: "R" or "r1,r2,..."
    precisions: tuple[str, ...] = ("fp32",)
    resolution: tuple[int, int] | None = None  # None -> the checkpoint's native size
    eval_set: str | None = None  # "digits": held-out accuracy (the trained test models)
    rounds: int = 3  # bench rounds, interleaved over the configurations
    runs: int = 20  # timed runs per round
    threads: int | None = None
    budget_ms: float | None = None
    # Each configuration is exported for the sweep's one resolution (static: no symbolic
    # shapes, so ToMe graphs export in seconds); False: the dynamic graphs `export` writes.
    static: bool = True

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.runs < 1:
            raise ValueError(f"rounds and runs must be >= 1, got {self.rounds}, {self.runs}")
        if self.eval_set not in (None, "digits"):
            raise ValueError(f"eval set must be 'digits' or none, got {self.eval_set!r}")


@dataclass
class SweepPoint:
    patch: int
    merge: list[int]  # tokens merged per block
    precision: str
    tokens: int  # patch tokens entering the first block at the sweep's resolution
    tokens_last: int  # ... and entering the last block (fewer merged where few: the clamp)
    score: float  # accuracy (%) with an eval set, else mean cosine to the base
    cosine: float  # mean over the images of the cosine to the base model's outputs
    cosine_min: float  # ... and its minimum
    passed: bool  # the export's parity (and the precision's policy)
    provider: str = ""  # what ran the timing
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    rounds_p50_ms: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        merge = f"r{self.merge[0]}" if self.merge and len(set(self.merge)) == 1 else (
            "r" + "/".join(map(str, self.merge)) if self.merge else "r0")
        return f"P{self.patch} {merge} {self.precision}"


@dataclass
class SweepReport:
    checkpoint: str
    resolution: tuple[int, int]
    metric: str  # "accuracy" | "cosine"
    points: list[SweepPoint]
    options: dict[str, Any]
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)  # configurations that cannot run

    def pareto(self) -> list[SweepPoint]:
        """Points no other point beats on both score (higher) and p90 (lower)."""
        front = [p for p in self.points if not any(
            q.score >= p.score and q.p90_ms <= p.p90_ms and (q.score, -q.p90_ms) != (p.score, -p.p90_ms)
            for q in self.points)]
        return sorted(front, key=lambda p: p.p90_ms)

    def best_under(self, budget_ms: float) -> SweepPoint | None:
        fits = [p for p in self.points if p.p90_ms <= budget_ms and p.passed]
        return max(fits, key=lambda p: (p.score, -p.p90_ms), default=None)

    def to_dict(self) -> dict[str, Any]:
        budget = self.options.get("budget_ms")
        best = self.best_under(budget) if budget else None
        return {"checkpoint": self.checkpoint, "resolution": list(self.resolution),
                "metric": self.metric, "seconds": round(self.seconds, 1),
                "options": self.options,
                "points": [asdict(p) | {"label": p.label} for p in self.points],
                "pareto": [p.label for p in self.pareto()], "skipped": self.skipped,
                "best_under_budget": best.label if best else None}

    def to_json(self) -> str:
        return dumps_strict(self.to_dict())

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        front = {id(p) for p in self.pareto()}
        unit = "%" if self.metric == "accuracy" else ""
        table = Table("config", "tokens (first → last block)", self.metric,
                      "cosine to base (mean / min)",
                      "ran on", "p50 ms", "p90 ms", "parity", "Pareto",
                      title=f"sweep {self.checkpoint} at {format_resolution(self.resolution)}",
                      title_justify="left")
        for p in self.points:
            table.add_row(p.label, f"{p.tokens} → {p.tokens_last}",
                          f"{p.score:.2f}{unit}" if unit else f"{p.score:.5f}",
                          f"{p.cosine:.5f} / {p.cosine_min:.5f}", p.provider, f"{p.p50_ms:.2f}", f"{p.p90_ms:.2f}",
                          "ok" if p.passed else "[red]FAIL[/]", "*" if id(p) in front else "")
        lines: list[Any] = [table]
        budget = self.options.get("budget_ms")
        if budget:
            best = self.best_under(budget)
            lines.append(f"most {self.metric} under {budget:g} ms (p90, this machine): "
                         + (best.label if best else "none fits"))
        lines += [f"skipped {s}" for s in self.skipped]
        lines.append(f"sweep took {self.seconds:.0f} s")
        return Group(*lines)

    def plot(self, path: str | Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for precision in dict.fromkeys(p.precision for p in self.points):
            pts = [p for p in self.points if p.precision == precision]
            ax.scatter([p.p90_ms for p in pts], [p.score for p in pts], label=precision)
            for p in pts:
                ax.annotate(p.label.rsplit(" ", 1)[0], (p.p90_ms, p.score), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        front = self.pareto()
        ax.plot([p.p90_ms for p in front], [p.score for p in front], "k--", lw=0.8,
                label="Pareto front")
        ax.set_xlabel("p90 latency, ms (batch 1, this machine)")
        ax.set_ylabel("held-out accuracy, %" if self.metric == "accuracy" else "cosine to base")
        ax.set_title(f"{Path(self.checkpoint).name} at {format_resolution(self.resolution)}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        plt.close(fig)
        return write_bytes_atomic(path, buffer.getvalue())


def run_sweep(checkpoint: str | Path, options: SweepOptions = SweepOptions(), *,
              progress: Progress = silent) -> SweepReport:
    """Export, score and time every configuration; the exports live in a temporary folder
    that is removed afterwards (nothing is written but what the caller asks for)."""
    import time

    from vit_deploy.runtime.config import parse_merge
    from vit_deploy.export.bundle import ExportOptions, export_bundle, model_from_flags
    from vit_deploy.precisions.add import PrecisionOptions, add_precisions

    start = time.perf_counter()
    base, _ = model_from_flags(checkpoint=checkpoint)
    cfg = base.cfg
    patches = options.patches or (cfg.patch_size,)
    resolution = options.resolution or cfg.img_size
    _check_patches(patches, resolution, cfg, given_res=options.resolution is not None)
    merges = [parse_merge(m, cfg.depth) for m in options.merges]  # refuses bad specs up front
    inputs = _eval_inputs(options.eval_set, resolution, cfg)
    points: list[tuple[SweepPoint, Path]] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vit-deploy-sweep-") as tmp:
        progress("the base model's outputs (checkpoint patch size, no merging, fp32)")
        reference = _forward_torch(base, inputs.x)
        for patch in patches:
            for merge, spec in zip(merges, options.merges):
                model = _configured(base, patch, merge)
                bundle = Path(tmp) / f"p{patch}-m{'-'.join(map(str, merge)) or '0'}"
                progress(f"exporting P{patch} merge {list(merge) or 0}")
                result = export_bundle(model, bundle, options=ExportOptions(
                    resolution=resolution, simplify=False, static=options.static))
                quantised = [p for p in options.precisions if p != "fp32"]
                report = None
                if quantised:
                    progress(f"quantising P{patch} merge {list(merge) or 0}: {quantised}")
                    report = add_precisions(bundle, quantised, options=PrecisionOptions(
                        force=True))
                grid = (resolution[0] // patch) * (resolution[1] // patch)
                for precision in options.precisions:
                    passed = bool(result.report) and (
                        report is None or precision not in report.failed)
                    out = _forward_bundle(bundle, precision, inputs.x)
                    cos, cos_min = _cosines(reference, out)
                    score = (float((out.argmax(1) == inputs.labels).mean() * 100)
                             if inputs.labels is not None else cos)
                    points.append((SweepPoint(
                        patch=patch, merge=list(merge), precision=precision, tokens=grid,
                        tokens_last=grid - sum(model.cfg.merge_schedule(grid)[:-1]), score=score,
                        cosine=cos, cosine_min=cos_min, passed=passed), bundle))
        _time(points, resolution, options, progress)
    return SweepReport(checkpoint=str(checkpoint), resolution=tuple(resolution),
                       metric="accuracy" if inputs.labels is not None else "cosine",
                       points=[p for p, _ in points], seconds=time.perf_counter() - start,
                       skipped=skipped,
                       options=asdict(options) | {"resolution": list(resolution)})


def _check_patches(patches: tuple[int, ...], resolution: tuple[int, int], cfg: Any, *,
                   given_res: bool) -> None:
    """Every patch size must tile the sweep's one resolution; refused before any export,
    naming the checkpoint's own size (not a default model's)."""
    own = f"img_size {format_resolution(cfg.img_size)}, patch {cfg.patch_size}"
    for patch in patches:
        if resolution[0] % patch or resolution[1] % patch:
            where = (f"--res {format_resolution(resolution)} (the checkpoint has {own})"
                     if given_res else f"the checkpoint's size (its {own})")
            raise ValueError(f"--patch {patch} does not tile {where}: expected a patch size "
                             f"that divides both sides")


def _configured(base: Any, patch: int, merge: tuple[int, ...]) -> Any:
    """The base model at another patch size and / or with token merging. Derived from the
    loaded base, not reloaded with model_from_flags(patch=...): that builds a default
    config first (ViT-B at 224), whose size a patch that fits the checkpoint may not tile."""
    model = base.with_patch_size(patch)
    return model.with_merging(merge) if merge else model


@dataclass
class _Inputs:
    x: np.ndarray
    labels: np.ndarray | None


def _eval_inputs(eval_set: str | None, resolution: tuple[int, int], cfg: Any) -> _Inputs:
    from vit_deploy.parity import sample_inputs

    if eval_set != "digits":
        return _Inputs(sample_inputs(resolution, EVAL_IMAGES, channels=cfg.in_chans, seed=7), None)
    if resolution[0] != resolution[1]:
        raise ValueError(f"the digits are square: sweep them at a square resolution, got "
                         f"{format_resolution(resolution)}")
    from vit_deploy.data import load_digits_split, normalise

    split = load_digits_split(resolution[0])
    return _Inputs(normalise(split["test_images"]), split["test_labels"])


def _forward_torch(model: Any, x: np.ndarray) -> np.ndarray:
    from vit_deploy.export.model import numpy_forward

    forward = numpy_forward(model)
    return np.concatenate([forward(x[i:i + 64]) for i in range(0, len(x), 64)])


def _forward_bundle(bundle: Path, precision: str, x: np.ndarray) -> np.ndarray:
    from vit_deploy.runtime.session import ViTSession

    with ViTSession(bundle, precision=precision) as s:
        return np.concatenate([s.run(x[i:i + 64]) for i in range(0, len(x), 64)])


def _cosines(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Mean and minimum over the images of the cosine between their outputs."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cos = (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))
    return float(cos.mean()), float(cos.min())


def _time(points: list[tuple[SweepPoint, Path]], resolution: tuple[int, int],
          options: SweepOptions, progress: Progress) -> None:
    """`vit-deploy bench` per configuration, each alone in a fresh process, rounds
    interleaved (config A B C ..., then again), so drift hits every configuration alike."""
    res = f"{resolution[0]}x{resolution[1]}"
    for r in range(options.rounds):
        for i, (point, bundle) in enumerate(points):
            progress(f"timing round {r + 1}/{options.rounds}: {point.label} "
                     f"({i + 1}/{len(points)})")
            case = _bench_once(bundle, point.precision, res, options)
            point.provider = case["provider"]
            point.rounds_p50_ms.append(case["p50_ms"])
            point.p90_ms = max(point.p90_ms, case["p90_ms"]) if r else case["p90_ms"]
    for point, _ in points:
        point.p50_ms = float(np.median(point.rounds_p50_ms))


def _bench_once(bundle: Path, precision: str, res: str, options: SweepOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-c", "from vit_deploy.cli import main; main()", "bench",
               str(bundle), "--precision", precision, "--res", res, "--runs", str(options.runs),
               "--sessions", "1", "--warmup", "3", "--json", str(out),
               "--threads", str(options.threads) if options.threads else "default"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"vit-deploy bench failed on {bundle.name} {precision}: "
                               f"{(done.stderr or done.stdout).strip()[-500:]}")
        cases = json.loads(out.read_text())["cases"]
    return cases[0]


def parse_list(text: str | None, kind: type = str) -> tuple[Any, ...]:
    """'8,16,32' -> (8, 16, 32); merge specs are separated by ';' or ' ' when they are
    schedules ('0;8;4,4,4,4')."""
    if not text:
        return ()
    sep = ";" if ";" in text else ","
    parts = [p.strip() for p in text.split(sep) if p.strip()]
    try:
        return tuple(kind(p) for p in parts)
    except ValueError:
        raise ValueError(f"expected a comma-separated list of {kind.__name__}s, got {text!r}") \
            from None


__all__ = ["SweepOptions", "SweepPoint", "SweepReport", "run_sweep", "parse_list"]
