"""The sessions `vit-deploy check` judges: one per provider × precision, of the bundle's
input kind (ViTSession, or NaFlexSession for a NaFlex bundle); a provider that is not
available goes to the report, not up as an error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vit_deploy.progress import Progress
from vit_deploy.runtime.naflex.session import open_session
from vit_deploy.runtime.ort_session import RuntimeOptions
from vit_deploy.runtime.providers import parse_providers, short_name


def sessions(bundle: Path, options: Any, precisions: tuple[str, ...], report: Any,
             progress: Progress, target: str = "none") -> Iterator[tuple[str, str, Any]]:
    """(provider that ran, precision, open session) per provider × precision, the session
    the bundle's input kind needs (open_session); a provider that is not available (or
    fails to load the model) goes to report.unavailable."""
    for provider in [p.name for p in parse_providers(list(options.providers))]:
        alias = short_name(provider)
        for precision in precisions:
            progress(f"{alias} {precision}: creating the session")
            try:
                session = open_session(bundle, provider=provider, precision=precision,
                                       options=RuntimeOptions(verify=False),  # verified above
                                       target=target)  # "none": bucket graphs on their own
            except Exception as e:  # ProviderError, or a provider that fails to load the model
                report.unavailable.setdefault(alias, str(e).splitlines()[0])
                continue
            with session:
                if session.engine not in report.engines:
                    report.engines.append(session.engine)
                yield short_name(session.providers[0]), precision, session
