"""`vit-deploy predict`: classify images with a bundle (or a bare .onnx file), and write
their dense features; torch-free, it runs on the base install.

    result = predict("bundle/", ["cat.jpg"], PredictOptions(top_k=3))
    print(result.to_json())
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_deploy.outputs import write_features
from vit_deploy.runtime.contract import LOGITS_NAME
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.runtime.manifest import dumps_strict, load_manifest
from vit_deploy.runtime.providers import short_name
from vit_deploy.runtime.ort_session import RuntimeOptions
from vit_deploy.runtime.results import Prediction
from vit_deploy.runtime.session import ViTSession


@dataclass(frozen=True, kw_only=True)
class PredictOptions:
    provider: str = "cpu"  # alias or list in preference order
    fallback: bool = False
    precision: str = "fp32"
    top_k: int = 5
    target: str = "auto"  # bucket graphs: auto, none, or a target name
    threads: int | None = None
    # Overrides of the manifest's preprocessing (a bare .onnx file needs the last three).
    # Any of them sends every image through the dynamic graph instead of its bucket.
    resize: str | None = None
    resolution: tuple[int, int] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    patch: int | None = None  # a bare .onnx file not exported by vit-deploy: its patch size
    features: Path | None = None  # also write the dense outputs to this .npz

    @property
    def overrides(self) -> dict[str, Any]:
        return {"resize": self.resize, "resolution": self.resolution, "mean": self.mean,
                "std": self.std, "patch_size": self.patch}


@dataclass(frozen=True)
class PredictResult:
    providers: list[str]  # short names, the one that ran first
    precision: str
    predictions: list[Prediction]
    features: dict[str, Any] | None  # {file, shapes} when --features was written
    fallback_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"providers": self.providers, "precision": self.precision,
                "predictions": [p.to_dict() for p in self.predictions],
                "features": self.features}

    def to_json(self) -> str:
        return dumps_strict(self.to_dict())

    def lines(self) -> list[str]:
        """The result alone (`predict --quiet`): per image and class one tab-separated line,
        image, rank, class, label, probability; then the --features file written."""
        out = [f"{p.source}\t{rank}\t{c.index}\t{' '.join((c.label or '').split())}\t"
               f"{c.probability:.4f}"
               for p in self.predictions for rank, c in enumerate(p.top, 1)]
        if self.features:
            out.append(str(self.features["file"]))
        return out

    def __rich__(self) -> Any:
        from rich.console import Group

        lines: list[Any] = [f"ran on {self.providers[0]} ({self.precision})"
                            + (f"; {self.fallback_reason}" if self.fallback_reason else "")]
        lines += self.predictions
        if self.features:
            lines.append(f"wrote {self.features['file']}: " + ", ".join(
                f"{k} {tuple(v)}" for k, v in self.features["shapes"].items()))
        return Group(*lines)


def predict(bundle: str | Path, images: Sequence[str | Path],
            options: PredictOptions = PredictOptions()) -> PredictResult:
    """Top-k classes of each image (a classifier), and with `options.features` each image's
    dense outputs in one .npz. A bundle without a classifier needs `features`."""
    images = list(images)
    if (Path(bundle) / MANIFEST_NAME).is_file() and load_manifest(bundle, verify=False).naflex:
        return predict_naflex(bundle, images, options)
    with warnings.catch_warnings():  # a fallback is reported in the result, in plain words
        warnings.simplefilter("ignore", RuntimeWarning)
        session = ViTSession(bundle, provider=options.provider, precision=options.precision,
                             fallback=options.fallback,
                             options=RuntimeOptions(threads=options.threads),
                             target=options.target)
    with session:
        classifier = LOGITS_NAME in session.output_names
        if not classifier and options.features is None:
            raise ValueError(f"{bundle} has no classifier (outputs: {session.output_names}); "
                             f"write its features with --features out.npz")
        pre = session.preprocess(**options.overrides)
        if session.buckets is not None and not any(v is not None
                                                   for v in options.overrides.values()):
            pre = None  # bucket graphs: each image goes to its bucket (runtime/buckets.py)
        predictions = (session.predict(images, top_k=options.top_k, preprocess=pre)
                       if classifier else [])
        written = None
        if options.features is not None:
            dense = session.preprocess(**(options.overrides | {
                "resize": options.resize or "patch_multiple"}))
            written = write_features(session, images, dense, options.features)
        return PredictResult([short_name(p) for p in session.providers], options.precision,
                             predictions, written, session.fallback_reason)


NAFLEX_CHUNK = 16  # images per NaFlex batch (each padded to the bundle's patch budget)


def predict_naflex(bundle: str | Path, images: list[str | Path],
                   options: PredictOptions) -> PredictResult:
    """A NaFlex bundle (no classifier): each image at its own aspect ratio, in mixed
    batches; `features` gets `pooled` (B, width) and `patch_tokens_<i>` (width, gh, gw)."""
    import io

    import numpy as np

    from vit_deploy.runtime.files import write_bytes_atomic
    from vit_deploy.runtime.naflex.session import NaFlexSession
    from vit_deploy.runtime.results import require_finite

    given = [k for k, v in options.overrides.items() if v is not None]
    given += [f"{flag} {value}" for flag, value, default in (
        ("--top-k", options.top_k, PredictOptions.top_k),  # no classifier: no classes
        ("--target", options.target, PredictOptions.target))  # no bucket graphs
        if value != default]
    if given:
        raise ValueError(f"a NaFlex bundle has no classifier and no bucket graphs, and "
                         f"resizes each image to its own patch grid (the bundle's rule): "
                         f"{', '.join(given)} cannot apply")
    if options.features is None:
        raise ValueError(f"{bundle} is a NaFlex bundle with no classifier (outputs pooled, "
                         f"last_hidden_state); write its features with --features out.npz")
    session = NaFlexSession(bundle, provider=options.provider, precision=options.precision,
                            options=RuntimeOptions(threads=options.threads))
    arrays: dict[str, Any] = {"sources": np.array([str(i) for i in images])}
    pooled = []
    with session:
        for start in range(0, len(images), NAFLEX_CHUNK):
            out = session.features(images[start:start + NAFLEX_CHUNK])
            pooled.append(require_finite(out.pooled, "pooled"))
            for i, tokens in enumerate(out.tokens, start):  # (gh, gw, D) -> (D, gh, gw)
                arrays[f"patch_tokens_{i}"] = require_finite(tokens, "last_hidden_state"
                                                             ).transpose(2, 0, 1)
    arrays["pooled"] = np.concatenate(pooled)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomic(Path(options.features), buffer.getvalue())
    written = {"file": str(options.features),
               "shapes": {k: list(v.shape) for k, v in arrays.items() if k != "sources"}}
    return PredictResult([short_name(p) for p in session.providers], options.precision, [],
                         written, session.fallback_reason)


__all__ = ["PredictOptions", "PredictResult", "predict", "predict_naflex"]
