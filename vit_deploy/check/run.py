"""`vit-deploy check`: a bundle against PyTorch, every provider × precision × size × batch.

The reference is PyTorch rebuilt from the bundle's weights (`pytorch`), or the golden
outputs stored in the bundle at export (`bundle`: runtime/references.py, no torch needed).
`auto` takes PyTorch where torch imports and the bundle has weights, else the references.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_deploy.reports.schema import device, envelope
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.references import iter_references

from vit_deploy.runtime.contract import PRECISIONS
from vit_deploy.outputs import OutputSelection
from vit_deploy.parity import Forward, ParityReport, batch_independence, compare, determinism, sample_inputs
from vit_deploy.progress import Progress, silent
from vit_deploy.runtime.manifest import Manifest, dumps_strict, load_manifest
from vit_deploy.check.retrieval import Retrieval, RetrievalJudge
from vit_deploy.check.sessions import sessions
from vit_deploy.precisions.agreement import NEIGHBOURS
from vit_deploy.runtime.session import ViTSession
from vit_deploy.runtime.sizes import format_resolution, guard_memory


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    providers: tuple[str, ...] = ("cpu",)
    precisions: tuple[str, ...] = ()  # () -> every precision in the bundle
    resolutions: tuple[tuple[int, int], ...] = ()  # () -> deploy and native sizes
    batches: tuple[int, ...] = (1, 4)
    require: bool = False  # an unavailable provider is a failure
    targets: bool = True  # also every edge target's bucket graphs, each at its own size
    reference: str = "auto"  # auto | pytorch | bundle (see the module doc)
    retrieval: bool = True  # an embedding bundle: the neighbours each precision keeps


REFERENCES = ("auto", "pytorch", "bundle")
PYTORCH_REFERENCE = "pytorch fp32 (rebuilt from the bundle's weights)"


@dataclass
class CheckReport:
    bundle: str
    parity: ParityReport
    unavailable: dict[str, str] = field(default_factory=dict)  # provider -> why
    require: bool = False
    reference: str = PYTORCH_REFERENCE
    engines: list[str] = field(default_factory=list)  # what ran: 'onnxruntime 1.31.1', ...
    retrieval: list[Retrieval] = field(default_factory=list)  # check/retrieval.py

    def __bool__(self) -> bool:
        """Passed: every case and check held, at least one case was compared (a check that
        compared nothing has not passed), no required provider missing."""
        return (bool(self.parity) and bool(self.parity.cases)
                and not (self.require and self.unavailable))

    @property
    def nothing_compared(self) -> str | None:
        return None if self.parity.cases else (
            "no case was compared (no provider ran, or no reference matched what was "
            "asked): not a pass")

    def to_dict(self) -> dict[str, Any]:
        """The shared report schema (reports/schema.py, kind "check") with this report's
        own fields (checks, unavailable providers, each case's top-1 and fallback nodes)."""
        return {**envelope("check", bundle=self.bundle, device=device(),
                           reference=self.reference, passed=bool(self)),
                **self.parity.to_dict(), "passed": bool(self), "latency": [],
                "unavailable": self.unavailable, "require": self.require,
                "engines": self.engines, "retrieval": [r.to_dict() for r in self.retrieval]}

    def to_json(self) -> str:
        return dumps_strict(self.to_dict())

    def __rich__(self) -> Any:
        from rich.console import Group

        lines: list[Any] = [f"{self.bundle} vs {self.reference}"
                            + (f" (ran on {', '.join(self.engines)})" if self.engines else ""),
                            self.parity]
        if self.retrieval:
            r = self.retrieval[0]
            lines.append(f"neighbours kept ({r.output}: each of {r.photographs} photographs' "
                         f"{NEIGHBOURS} nearest, vs fp32 on cpu; not part of the verdict):")
            lines += [f"  {r}" for r in self.retrieval]
        for provider, why in self.unavailable.items():
            lines.append(f"{provider}: not available here"
                         f"{' (required)' if self.require else ''}: {why}")
        if self.nothing_compared:
            lines.append(f"[red]{self.nothing_compared}[/]")
        lines.append(f"check: {'PASS' if self else f'[red]{self.verdict}[/]'}")
        return Group(*lines)

    @property
    def verdict(self) -> str:
        """PASS, or FAIL with how many cases, checks and required providers failed."""
        if self:
            return "PASS"
        failures = (len(self.parity.failures) + (len(self.unavailable) if self.require else 0)
                    + bool(self.nothing_compared))
        return f"FAIL ({failures} failing)"

    def to_markdown(self) -> str:
        lines = [f"# vit-deploy check: {self.bundle}", "",
                 f"Result: **{'PASS' if self else 'FAIL'}**; reference: {self.reference}.", "",
                 "| case | provider (ran) | precision | max \\|Δ\\| | max rel Δ | cosine | top-1 "
                 "agree | CPU-fallback nodes | result |", "|---|---|---|---|---|---|---|---|---|"]
        for c in self.parity.cases:
            lines.append(f"| {c.label} | {c.provider} | {c.precision} | {c.max_abs:.2e} | "
                         f"{c.max_rel:.2e} | {c.cosine:.6f} | {c.top1_text} | "
                         f"{c.fallback_nodes} | {'ok' if c.passed else '**FAIL**'} |")
        if self.parity.checks:
            lines += ["", "| check | subject | value | limit | detail | result |",
                      "|---|---|---|---|---|---|"]
            for k in self.parity.checks:
                lines.append(f"| {k.name} | {k.subject} | {k.value:.2e} | {k.limit:.1e} | "
                             f"{k.detail} | {'ok' if k.passed else '**FAIL**'} |")
        for provider, why in self.unavailable.items():
            lines.append(f"\n- {provider}: not available here"
                         f"{' (required: FAIL)' if self.require else ''}: {why}")
        if self.nothing_compared:
            lines.append(f"\n- {self.nothing_compared}")
        lines += [f"\n- neighbours kept: {r}" for r in self.retrieval]
        return "\n".join(lines) + "\n"


def run_check(bundle: str | Path, options: CheckOptions = CheckOptions(),
              progress: Progress = silent) -> CheckReport:
    """Raises BundleError for a bundle that does not verify (or that has no references
    where torch is missing), ImportError for `pytorch` without torch."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)  # sizes and hashes checked here
    precisions = options.precisions or tuple(p for p in PRECISIONS if p in manifest.models)
    manifest.require_models(precisions)
    golden = reference_kind(bundle, manifest, options.reference) == "bundle"
    if manifest.naflex:  # the other input kind: patches + mask + grids, its own cases
        from vit_deploy.check.naflex import check_naflex

        report = CheckReport(str(bundle), ParityReport(), require=options.require)
        check_naflex(bundle, manifest, options, precisions, report, progress, golden=golden)
        return report
    if golden:
        return _check_golden(bundle, manifest, options, precisions, progress)
    resolutions = options.resolutions or tuple(
        dict.fromkeys([manifest.deploy_resolution, manifest.native_resolution]))
    for hw in resolutions:
        manifest.require_size(hw)
    largest = max(resolutions, key=lambda hw: hw[0] * hw[1])
    guard_memory(*largest, manifest.config, batch=max(options.batches))
    progress("rebuilding the PyTorch reference from the bundle's weights")
    reference = _torch_reference(bundle, manifest)
    C = manifest.config.in_chans
    inputs = [sample_inputs(hw, b, channels=C, seed=5)
              for hw in resolutions for b in options.batches]
    progress(f"running PyTorch on {len(inputs)} cases")
    refs = [reference(x) for x in inputs]
    report = CheckReport(str(bundle), ParityReport(), require=options.require)
    judge = _judge(bundle, manifest, options)
    for ran, precision, session in sessions(bundle, options, precisions, report, progress):
        report.parity.cases += compare(
            session.run_all, refs, inputs, precision=precision, provider=ran,
            progress=progress, fallback_nodes=len(session.cpu_fallback_nodes()))
        _invariants(session, ran, precision, resolutions[0], C, report, progress)
        _retrieval(judge, ran, precision, session, report, progress)
    if options.targets:
        _check_buckets(bundle, manifest, options, precisions, reference, report, progress)
    return report


def reference_kind(bundle: Path, manifest: Manifest, asked: str) -> str:
    """'pytorch' or 'bundle' for `asked` (REFERENCES); BundleError where neither can be. A
    NaFlex bundle's references are its own part (naflex_references)."""
    if asked not in REFERENCES:
        raise ValueError(f"reference must be one of {list(REFERENCES)}, got {asked!r}")
    if asked == "bundle" or (asked == "auto" and (
            importlib.util.find_spec("torch") is None or manifest.weights_file is None)):
        if manifest.naflex and (manifest.naflex_references is None
                                or not manifest.naflex_references.cases):
            raise BundleError(f"bundle {str(bundle)!r} has no NaFlex golden references: "
                              f"check it against PyTorch (pip install 'vit-deploy[export]')")
        if not manifest.naflex and manifest.references is None:
            raise BundleError(
                f"bundle {str(bundle)!r} has no golden references (exported before vit-deploy "
                f"stored them, or none fit the size bound), so check needs PyTorch to compare "
                f"it: pip install 'vit-deploy[export]' and run check --reference pytorch "
                f"(or export the bundle again)")
        return "bundle"
    return "pytorch"


def golden_reference_text(manifest: Manifest) -> str:
    source = manifest.references.source if manifest.references else "?"
    return f"golden references ({source.replace(' (', ', ').rstrip(')')})"


def _invariants(session: ViTSession, ran: str, precision: str, hw: tuple[int, int],
                channels: int, report: CheckReport, progress: Progress) -> None:
    subject = f"{ran}:{precision}"
    progress(f"{subject}: batch independence and determinism")
    report.parity.checks.append(batch_independence(session.run_all, hw, subject=subject,
                                                   channels=channels))
    report.parity.checks.append(determinism(session.run_all, hw, subject=subject,
                                            channels=channels))


def _judge(bundle: Path, manifest: Manifest, options: CheckOptions) -> RetrievalJudge | None:
    return (RetrievalJudge(bundle, manifest)
            if options.retrieval and RetrievalJudge.applies(manifest) else None)


def _retrieval(judge: RetrievalJudge | None, ran: str, precision: str, session: ViTSession,
               report: CheckReport, progress: Progress) -> None:
    if judge is None or (ran, precision) == ("cpu", "fp32"):  # fp32 on the CPU: the reference
        return
    progress(f"{ran}:{precision}: the nearest neighbours of {len(judge.photos)} photographs")
    if (found := judge.judge(ran, precision, session)) is not None:
        report.retrieval.append(found)


def _check_golden(bundle: Path, manifest: Manifest, options: CheckOptions,
                  precisions: tuple[str, ...], progress: Progress) -> CheckReport:
    """Every provider × precision × stored case against the bundle's golden outputs (a
    target's cases through that target's bucket graphs), by the same policy."""
    refs = manifest.references
    if refs is None:
        raise BundleError(f"bundle {str(bundle)!r} has no golden references")
    if not refs.cases:
        raise BundleError(f"bundle {str(bundle)!r} lists golden references with no cases: "
                          f"there is nothing to compare against")
    unknown = sorted({c.target for c in refs.cases if c.target is not None
                      and c.target not in manifest.targets})
    if unknown:
        raise BundleError(f"bundle {str(bundle)!r}: golden reference cases name target(s) "
                          f"{unknown} that it does not have (targets: "
                          f"{sorted(manifest.targets) or 'none'})")
    kept = [c for c in refs.cases if not options.resolutions or c.resolution in options.resolutions]
    if not kept:
        raise ValueError(f"the bundle stores references at "
                         f"{sorted({format_resolution(c.resolution) for c in refs.cases})}, "
                         f"none at the sizes asked for "
                         f"{[format_resolution(hw) for hw in options.resolutions]}")
    for c in kept:  # before any input is built: a declared size is a claim, not a plan
        guard_memory(*c.resolution, manifest.config, batch=c.shape[0])
    progress(f"reading the golden references ({len(refs.cases)} cases)")
    stored = [(c, x, outs) for c, x, outs in iter_references(manifest.resolve(bundle, refs.file),
                                                            refs) if c in kept]
    report = CheckReport(str(bundle), ParityReport(), require=options.require,
                         reference=golden_reference_text(manifest))
    own = [(c, x, outs) for c, x, outs in stored if c.target is None]
    C = manifest.config.in_chans
    judge = _judge(bundle, manifest, options)
    for ran, precision, session in sessions(bundle, options, precisions, report, progress):
        report.parity.cases += compare(
            session.run_all, [o for _, _, o in own], [x for _, x, _ in own], precision=precision,
            provider=ran, progress=progress, fallback_nodes=len(session.cpu_fallback_nodes()),
            cases=[c.name if c.pixels is not None else "" for c, _, _ in own])
        _invariants(session, ran, precision, manifest.deploy_resolution, C, report, progress)
        _retrieval(judge, ran, precision, session, report, progress)
    for name, spec in manifest.targets.items() if options.targets else ():
        cases = [(c, x, outs) for c, x, outs in stored if c.target == name]
        target_precisions = tuple(p for p in spec.precisions if p in precisions)
        for ran, precision, session in sessions(bundle, options, target_precisions, report,
                                                 progress, target=name):
            for c, x, outs in cases:
                if spec.graph(precision, c.resolution) is not None:
                    report.parity.cases += compare(
                        session.run_all, [outs], [x], precision=precision,
                        provider=f"{ran} (bucket {name})", progress=progress)
    return report


def _check_buckets(bundle: Path, manifest: Manifest, options: CheckOptions,
                   precisions: tuple[str, ...], reference: Forward, report: CheckReport,
                   progress: Progress) -> None:
    """Each target's bucket graphs at their own size, every batch asked for (the runtime
    runs a batch in chunks of the graph's fixed batch)."""
    C = manifest.config.in_chans
    for name, spec in manifest.targets.items():
        for hw in spec.resolutions:
            inputs = [sample_inputs(hw, b, channels=C, seed=5) for b in options.batches]
            refs = [reference(x) for x in inputs]
            graphs = tuple(p for p in spec.precisions
                           if p in precisions and spec.graph(p, hw) is not None)
            for ran, precision, session in sessions(bundle, options, graphs, report, progress,
                                                    target=name):
                progress(f"{ran} {precision}: bucket {hw[0]}x{hw[1]} of target {name}")
                report.parity.cases += compare(
                    session.run_all, refs, inputs, precision=precision,
                    provider=f"{ran} (bucket {name})", progress=progress)


def _torch_reference(bundle: Path, manifest: Manifest) -> Forward:
    try:
        from vit_deploy.export.checkpoints import load_model
        from vit_deploy.export.model import numpy_forward, reference_model
    except ImportError:
        raise ImportError("vit-deploy check compares against PyTorch, which is not installed: "
                          "pip install 'vit-deploy[export]'") from None
    weights = manifest.weights_file
    if weights is None:
        raise ValueError(f"bundle {str(bundle)!r} holds no PyTorch weights to compare against")
    selection = OutputSelection(names=tuple(manifest.io.output_names),
                                layer_norm=manifest.io.layer_norm)
    model = load_model(manifest.resolve(bundle, weights))
    return numpy_forward(reference_model(model, selection))


__all__ = ["CheckOptions", "CheckReport", "run_check"]
