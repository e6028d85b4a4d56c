"""`vit-deploy check`: a bundle against PyTorch, every provider × precision × size × batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from vit_deploy.runtime.contract import PRECISIONS
from vit_deploy.outputs import OutputSelection
from vit_deploy.parity import Forward, ParityReport, batch_independence, compare, determinism, sample_inputs
from vit_deploy.progress import Progress, silent
from vit_deploy.runtime.manifest import Manifest, dumps_strict, load_manifest
from vit_deploy.runtime.providers import parse_providers, short_name
from vit_deploy.runtime.ort_session import RuntimeOptions
from vit_deploy.runtime.session import ViTSession
from vit_deploy.runtime.sizes import guard_memory


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    providers: tuple[str, ...] = ("cpu",)
    precisions: tuple[str, ...] = ()  # () -> every precision in the bundle
    resolutions: tuple[tuple[int, int], ...] = ()  # () -> deploy and native sizes
    batches: tuple[int, ...] = (1, 4)
    require: bool = False  # an unavailable provider is a failure
    targets: bool = True  # also every edge target's bucket graphs, each at its own size


@dataclass
class CheckReport:
    bundle: str
    parity: ParityReport
    unavailable: dict[str, str] = field(default_factory=dict)  # provider -> why
    require: bool = False
    reference: str = "pytorch fp32 (rebuilt from the bundle's weights)"

    def __bool__(self) -> bool:
        return bool(self.parity) and not (self.require and self.unavailable)

    def to_dict(self) -> dict[str, Any]:
        return {**self.parity.to_dict(), "bundle": self.bundle, "passed": bool(self),
                "reference": self.reference, "unavailable": self.unavailable,
                "require": self.require}

    def to_json(self) -> str:
        return dumps_strict(self.to_dict())

    def __rich__(self) -> Any:
        from rich.console import Group

        lines: list[Any] = [f"{self.bundle} vs {self.reference}", self.parity]
        for provider, why in self.unavailable.items():
            lines.append(f"{provider}: not available here"
                         f"{' (required)' if self.require else ''}: {why}")
        failures = len(self.parity.failures) + (len(self.unavailable) if self.require else 0)
        lines.append(f"check: {'PASS' if self else f'[red]FAIL ({failures} failing)[/]'}")
        return Group(*lines)

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
        return "\n".join(lines) + "\n"


def run_check(bundle: str | Path, options: CheckOptions = CheckOptions(),
              progress: Progress = silent) -> CheckReport:
    """Raises BundleError for a bundle that does not verify, ImportError without torch."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)  # sizes and hashes checked here
    precisions = options.precisions or tuple(p for p in PRECISIONS if p in manifest.models)
    manifest.require_models(precisions)
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
    for provider in [p.name for p in parse_providers(list(options.providers))]:
        alias = short_name(provider)
        for precision in precisions:
            progress(f"{alias} {precision}: creating the session")
            try:
                session = ViTSession(bundle, provider=provider, precision=precision,
                                     options=RuntimeOptions(verify=False),  # verified above
                                     target="none")  # bucket graphs: _check_buckets
            except Exception as e:  # ProviderError, or a provider that fails to load the model
                report.unavailable.setdefault(alias, str(e).splitlines()[0])
                continue
            with session:
                ran = short_name(session.providers[0])
                report.parity.cases += compare(
                    session.run_all, refs, inputs, precision=precision, provider=ran,
                    progress=progress, fallback_nodes=len(session.cpu_fallback_nodes()))
                subject = f"{ran}:{precision}"
                progress(f"{subject}: batch independence and determinism")
                report.parity.checks.append(batch_independence(
                    session.run_all, resolutions[0], subject=subject, channels=C))
                report.parity.checks.append(determinism(
                    session.run_all, resolutions[0], subject=subject, channels=C))
    if options.targets:
        _check_buckets(bundle, manifest, options, precisions, reference, report, progress)
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
            for provider in [p.name for p in parse_providers(list(options.providers))]:
                for precision in [p for p in spec.precisions if p in precisions]:
                    if spec.graph(precision, hw) is None:
                        continue
                    try:
                        session = ViTSession(bundle, provider=provider, precision=precision,
                                             options=RuntimeOptions(verify=False), target=name)
                    except Exception as e:  # as above: reported, not raised
                        report.unavailable.setdefault(short_name(provider),
                                                      str(e).splitlines()[0])
                        continue
                    with session:
                        ran = short_name(session.providers[0])
                        progress(f"{ran} {precision}: bucket {hw[0]}x{hw[1]} of target {name}")
                        report.parity.cases += compare(
                            session.run_all, refs, inputs, precision=f"{precision}",
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
