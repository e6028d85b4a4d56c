"""Comparing ONNX Runtime against the PyTorch reference, and the tolerance policy.

numpy only: the reference is any callable (B, C, H, W) -> (B, K), so this module is
shared by the exporter (torch reference) and by checks on a deployed bundle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Union

import numpy as np

from vit_deploy.runtime.contract import (COSINE_MIN, FP32_ABS_TOL, INDEPENDENCE_ABS_TOL, LOGITS_NAME,
                                 tolerance_class)
from vit_deploy.progress import Progress, silent
from vit_deploy.runtime.errors import FAILED, VitDeployError
from vit_deploy.runtime.sizes import format_resolution

# One output (B, K), or every output of a multi-output model by name.
Outputs = Union[np.ndarray, Mapping[str, np.ndarray]]
Forward = Callable[[np.ndarray], Outputs]


@dataclass(frozen=True)
class ParityCase:
    """One comparison: a resolution and batch on one provider at one precision."""

    resolution: tuple[int, int]
    batch: int
    provider: str  # the provider that actually ran
    precision: str
    max_abs: float
    max_rel: float  # max |Δ| / max |ref|
    cosine: float  # minimum over the batch of per-image cosine similarity
    top1_agree: float | None  # fraction of images with the same arg-max (logits only)
    abs_tol: float | None  # None where the policy has no absolute bound (quantised models)
    cosine_min: float
    passed: bool
    fallback_nodes: int = 0  # nodes ORT placed on CPU while another provider was asked for
    output: str = LOGITS_NAME  # which output of the model was compared
    case: str = ""  # a golden reference case that is not seeded noise (e.g. "photos")

    @property
    def label(self) -> str:
        named = "" if self.output == LOGITS_NAME else f" {self.output}"
        case = f" {self.case}" if self.case else ""
        return f"{format_resolution(self.resolution)} b{self.batch}{case}{named}"

    @property
    def top1_text(self) -> str:
        return "-" if self.top1_agree is None else f"{self.top1_agree:.0%}"


@dataclass(frozen=True)
class Invariant:
    """A property check (batch independence, determinism): pass/fail with the number."""

    name: str
    subject: str  # e.g. "pytorch" or "onnxruntime:cpu"
    passed: bool
    value: float
    limit: float
    detail: str = ""


@dataclass
class ParityReport:
    cases: list[ParityCase] = field(default_factory=list)
    checks: list[Invariant] = field(default_factory=list)

    def __bool__(self) -> bool:
        return all(c.passed for c in self.cases) and all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[ParityCase | Invariant]:
        return [c for c in [*self.cases, *self.checks] if not c.passed]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": bool(self), "cases": [asdict(c) | {"label": c.label} for c in self.cases],
                "checks": [asdict(c) for c in self.checks]}

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table("case", "provider (ran)", "precision", "max|Δ|", "tol", "max rel Δ",
                      "cosine", "top-1", "CPU-fallback nodes", "result", title="parity",
                      title_justify="left")
        for c in self.cases:
            table.add_row(c.label, c.provider, c.precision, f"{c.max_abs:.2e}",
                          "-" if c.abs_tol is None else f"{c.abs_tol:.1e}", f"{c.max_rel:.2e}",
                          f"{c.cosine:.7f}", c.top1_text, str(c.fallback_nodes),
                          "ok" if c.passed else "[red]FAIL[/]")
        for k in self.checks:
            table.add_row(k.name, k.subject, "", f"{k.value:.2e}", f"limit {k.limit:.1e}", "",
                          "", "", "", "ok" if k.passed else "[red]FAIL[/]")
        verdict = "PASS" if self else f"[red]FAIL ({len(self.failures)} failing)[/]"
        from rich.console import Group

        return Group(table, f"parity: {verdict}")

    def __str__(self) -> str:
        rows = [("case", "provider", "prec", "max|Δ|", "tol", "cosine", "top1", "result")]
        for c in self.cases:
            rows.append((c.label, c.provider, c.precision, f"{c.max_abs:.2e}",
                         "-" if c.abs_tol is None else f"{c.abs_tol:.1e}", f"{c.cosine:.7f}",
                         c.top1_text, "ok" if c.passed else "FAIL"))
        for k in self.checks:
            rows.append((k.name, k.subject, "", f"{k.value:.2e}", f"{k.limit:.1e}", "", "",
                         "ok" if k.passed else "FAIL"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        verdict = "PASS" if self else f"FAIL ({len(self.failures)} of {len(rows) - 1})"
        return "\n".join([*lines, f"parity: {verdict}"])


class ParityError(VitDeployError, RuntimeError):
    """Raised with the whole report when any case or check failed."""

    exit_code = FAILED

    def __init__(self, report: ParityReport):
        self.report = report
        super().__init__(f"parity failed in {len(report.failures)} case(s):\n{report}")

    def message(self) -> str:
        return "parity did not hold; nothing was written"

    def details(self) -> ParityReport:
        return self.report


def metrics(ref: np.ndarray, out: np.ndarray) -> dict[str, float]:
    """max |Δ|, relative max |Δ|, min per-row cosine, top-1 agreement of (B, K) arrays."""
    if ref.shape != out.shape:
        raise ValueError(f"reference shape {ref.shape} differs from output shape {out.shape}")
    ref64, out64 = ref.astype(np.float64).reshape(len(ref), -1), out.astype(np.float64).reshape(len(out), -1)
    diff = np.abs(ref64 - out64)
    scale = float(np.abs(ref64).max()) if ref64.size else 0.0
    norms = np.linalg.norm(ref64, axis=1) * np.linalg.norm(out64, axis=1)
    dots = (ref64 * out64).sum(axis=1)
    cos = np.where(norms > 0, dots / np.maximum(norms, 1e-300), (diff.max(axis=1) == 0) * 1.0)
    return {
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "max_rel": float(diff.max() / scale) if scale > 0 else float(diff.max() if diff.size else 0),
        "cosine": float(cos.min()) if cos.size else 1.0,
        "top1_agree": float((ref64.argmax(1) == out64.argmax(1)).mean()) if ref64.size else 1.0,
        "ref_scale": scale,
    }


def compare(run: Forward, references: Sequence[np.ndarray], inputs: Sequence[np.ndarray], *,
            precision: str = "fp32", provider: str, progress: Progress = silent,
            fallback_nodes: int = 0, cases: Sequence[str] | None = None) -> list[ParityCase]:
    """The one parity comparison: `run` on each input against its reference output, judged
    by the policy of `precision`'s tolerance class. Every case is kept, failing or not.
    A multi-output model gives {name: array}: each output is one case of its own."""
    if len(references) != len(inputs):
        raise ValueError(f"{len(references)} references for {len(inputs)} inputs")
    judged = []
    for ref, x, case in zip(references, inputs, cases or [""] * len(inputs)):
        hw = tuple(x.shape[2:])
        progress(f"parity {precision} on {provider}: {format_resolution(hw)} b{len(x)}")
        out = run(x)
        pairs = ([(name, r, _output(out, name)) for name, r in ref.items()]
                 if isinstance(ref, Mapping) else [(LOGITS_NAME, ref, _output(out, None))])
        for name, r, o in pairs:
            judged.append(replace(judge(r, o, resolution=hw, provider=provider,
                                        precision=precision, output=name),
                                  fallback_nodes=fallback_nodes, case=case))
    return judged


def _output(out: Outputs, name: str | None) -> np.ndarray:
    if not isinstance(out, Mapping):
        return out
    if name is None:  # a single reference: the logits, else the one output
        name = LOGITS_NAME if LOGITS_NAME in out else next(iter(out))
    if name not in out:
        raise ValueError(f"the model has no output {name!r}; it has {list(out)}")
    return out[name]


def _rows(out: Outputs) -> np.ndarray:
    """Every output of each image as one row (B, ...) -> (B, n), for the invariants."""
    if not isinstance(out, Mapping):
        return out.reshape(len(out), -1)
    return np.concatenate([v.reshape(len(v), -1) for v in out.values()], axis=1)


def judge(ref: np.ndarray, out: np.ndarray, *, resolution: tuple[int, int], provider: str,
          precision: str = "fp32", output: str = LOGITS_NAME) -> ParityCase:
    """Apply the tolerance policy (docs/check-and-bench.md) to one comparison. Every output is judged by
    the same rule (max |Δ| scaled by the reference's largest value, and the cosine of each
    image's whole output); top-1 agreement is reported for logits."""
    policy = tolerance_class(precision)
    m = metrics(ref, out)
    abs_tol = FP32_ABS_TOL * max(1.0, m["ref_scale"]) if policy == "fp32" else None
    cos_min = COSINE_MIN[policy]
    passed = m["cosine"] >= cos_min and (abs_tol is None or m["max_abs"] <= abs_tol)
    passed = passed and bool(np.isfinite(out).all())
    return ParityCase(resolution=tuple(resolution), batch=len(ref), provider=provider,
                      precision=precision, max_abs=m["max_abs"], max_rel=m["max_rel"],
                      cosine=m["cosine"], abs_tol=abs_tol, cosine_min=cos_min, passed=passed,
                      top1_agree=m["top1_agree"] if output == LOGITS_NAME else None,
                      output=output)


def sample_inputs(resolution: tuple[int, int], batch: int, *, channels: int = 3,
                  seed: int = 0) -> np.ndarray:
    """Deterministic normalised-pixel-like inputs, (B, C, H, W) float32."""
    rng = np.random.default_rng([seed, resolution[0], resolution[1], batch])
    return rng.standard_normal((batch, channels, *resolution), dtype=np.float32)


def determinism(forward: Forward, resolution: tuple[int, int], *, subject: str, batch: int = 2,
                channels: int = 3) -> Invariant:
    """The same input twice gives the same output."""
    x = sample_inputs(resolution, batch, channels=channels, seed=2)
    a, b = _rows(forward(x)), _rows(forward(x.copy()))
    moved = float(np.abs(a - b).max())
    limit = INDEPENDENCE_ABS_TOL * max(1.0, float(np.abs(a).max()))
    return Invariant(name="determinism", subject=subject, passed=moved <= limit, value=moved,
                 limit=limit, detail=f"{format_resolution(resolution)} b{batch}, run twice")


def batch_independence(forward: Forward, resolution: tuple[int, int], *, subject: str,
                       batch: int = 3, channels: int = 3,
                       given: tuple[np.ndarray, Outputs] | None = None) -> Invariant:
    """Change only the last image of a batch: no other image's output may move. `given`:
    a batch (of `resolution`) and its outputs, already computed (a parity case): only the
    changed batch runs."""
    x = given[0] if given else sample_inputs(resolution, batch, channels=channels, seed=1)
    batch = len(x)
    x2 = x.copy()
    x2[-1] += 10.0
    a, b = _rows(given[1] if given else forward(x)), _rows(forward(x2))
    moved = float(np.abs(a[:-1] - b[:-1]).max())
    scale = max(1.0, float(np.abs(a).max()))
    limit = INDEPENDENCE_ABS_TOL * scale
    changed = float(np.abs(a[-1] - b[-1]).max())
    return Invariant(name="batch-independence", subject=subject, passed=moved <= limit, value=moved,
                 limit=limit, detail=f"{format_resolution(resolution)} b{batch}; the changed "
                                     f"image moved by {changed:.3g}")
