"""`vit-deploy check`: a bundle against PyTorch, every provider × precision × size × batch."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.contract import PRECISIONS
from vit_deploy.parity import (Check, ParityReport, batch_independence, determinism,
                               judge, sample_inputs)
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.providers import parse_providers, short_name
from vit_deploy.runtime.session import RuntimeOptions, ViTSession
from vit_deploy.sizes import check_input_size, format_resolution


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    providers: tuple[str, ...] = ("cpu",)
    precisions: tuple[str, ...] = ()  # () -> every precision in the bundle
    resolutions: tuple[tuple[int, int], ...] = ()  # () -> deploy and native sizes
    batches: tuple[int, ...] = (1, 4)
    require: bool = False  # an unavailable provider is a failure


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
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        lines = [f"# vit-deploy check: {self.bundle}", "",
                 f"Result: **{'PASS' if self else 'FAIL'}**; reference: {self.reference}.", "",
                 "| case | provider (ran) | precision | max \\|Δ\\| | max rel Δ | cosine | top-1 "
                 "agree | CPU-fallback nodes | result |", "|---|---|---|---|---|---|---|---|---|"]
        for c in self.parity.cases:
            lines.append(f"| {c.label} | {c.provider} | {c.precision} | {c.max_abs:.2e} | "
                         f"{c.max_rel:.2e} | {c.cosine:.6f} | {c.top1_agree:.0%} | "
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
              progress: Callable[[str], None] = lambda _: None) -> CheckReport:
    """Raises BundleError for a bundle that does not verify, ImportError without torch."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)  # sizes and hashes checked here
    reference = _torch_reference(bundle, manifest)
    cfg = manifest["config"]
    precisions = options.precisions or tuple(p for p in PRECISIONS if p in manifest["models"])
    missing = [p for p in precisions if p not in manifest["models"]]
    if missing:
        raise ValueError(f"bundle has no {missing} model(s); it has {sorted(manifest['models'])}")
    deploy, native = tuple(manifest["preprocess"]["resolution"]), tuple(cfg["img_size"])
    if not manifest["io"]["dynamic"]:
        native = deploy
    resolutions = options.resolutions or tuple(dict.fromkeys([deploy, native]))
    for hw in resolutions:
        check_input_size(*hw, cfg["patch_size"])
        if not manifest["io"]["dynamic"] and hw != deploy:
            raise ValueError(f"this bundle is static at {format_resolution(deploy)}, cannot "
                             f"check {format_resolution(hw)}")
    inputs = {(hw, b): sample_inputs(hw, b, channels=cfg["in_chans"], seed=5)
              for hw in resolutions for b in options.batches}
    refs = {k: reference(x) for k, x in inputs.items()}
    report = CheckReport(str(bundle), ParityReport(), require=options.require)
    for provider in [p.name for p in parse_providers(list(options.providers))]:
        alias = short_name(provider)
        for precision in precisions:
            progress(f"{alias} {precision}")
            try:
                session = ViTSession(bundle, provider=provider, precision=precision,
                                     options=RuntimeOptions(verify=False))  # verified above
            except Exception as e:  # ProviderError, or a provider that fails to load the model
                report.unavailable.setdefault(alias, str(e).splitlines()[0])
                continue
            with session:
                ran = short_name(session.providers[0])
                fallback = len(session.cpu_fallback_nodes())
                for (hw, b), x in inputs.items():
                    case = judge(refs[(hw, b)], session.run(x), resolution=hw, provider=ran,
                                 precision=precision.split("-")[0])
                    report.parity.cases.append(replace(case, precision=precision,
                                                       fallback_nodes=fallback))
                subject = f"{ran}:{precision}"
                report.parity.checks.append(batch_independence(
                    session.run, resolutions[0], subject=subject, channels=cfg["in_chans"]))
                report.parity.checks.append(determinism(
                    session.run, resolutions[0], subject=subject, channels=cfg["in_chans"]))
    return report


def _torch_reference(bundle: Path, manifest: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    try:
        from vit_deploy.export.checkpoints import load_model
        from vit_deploy.export.model import numpy_forward
    except ImportError:
        raise ImportError("vit-deploy check compares against PyTorch, which is not installed: "
                          "pip install 'vit-deploy[export]'") from None
    weights = [n for n, e in manifest["files"].items() if e.get("role") == "weights"]
    if not weights:
        raise ValueError(f"bundle {str(bundle)!r} holds no PyTorch weights to compare against")
    return numpy_forward(load_model(bundle / weights[0]))


__all__ = ["Check", "CheckOptions", "CheckReport", "run_check"]
