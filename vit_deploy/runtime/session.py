"""ViTSession: run a bundle (or one .onnx file) with ONNX Runtime. No torch here."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from vit_deploy.contract import INPUT_NAME, LOGITS_NAME, METADATA_CONFIG_KEY
from vit_deploy.runtime.manifest import BundleError, load_manifest
from vit_deploy.runtime.providers import (CPU, Provider, ProviderError, ProviderSpec, available,
                                          parse_providers, short_name)
from vit_deploy.sizes import check_input_size


class InputError(ValueError):
    """An input array the model cannot take: says what was expected and what was given."""


class ViTSession:
    """A context-managed ONNX Runtime session over a bundle directory or a .onnx file.

    Providers are checked after the session is created: asking for one that is not
    active is a ProviderError (strict, the default); with fallback=True the session
    runs on what is active, warns, and `providers` says what really runs.
    """

    def __init__(self, model: str | Path, *, provider: ProviderSpec | Sequence[ProviderSpec] = "cpu",
                 precision: str = "fp32", fallback: bool = False, verify: bool = True,
                 threads: int | None = None, session_options: ort.SessionOptions | None = None):
        path = Path(model)
        self.manifest: dict[str, Any] | None = None
        if path.is_dir():
            self.manifest = load_manifest(path, verify=verify)
            models = self.manifest["models"]
            if precision not in models:
                raise BundleError(f"bundle {str(path)!r} has no {precision!r} model; it has "
                                  f"{sorted(models)}")
            self.model_path = path / models[precision]
        elif path.is_file():
            self.model_path = path
        else:
            raise FileNotFoundError(f"no bundle directory or .onnx file at {str(path)!r}")
        self.precision = precision
        self.requested = parse_providers(provider)
        options = session_options or ort.SessionOptions()
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            options.intra_op_num_threads = threads
        self._session = _create_session(self.model_path, self.requested, options, fallback)
        self.providers: list[str] = self._session.get_providers()
        meta = self._session.get_modelmeta().custom_metadata_map
        config = (self.manifest or {}).get("config") or json.loads(meta.get(METADATA_CONFIG_KEY, "{}"))
        self.config: dict[str, Any] = config
        self.patch_size: int | None = config.get("patch_size")
        self.in_chans: int = config.get("in_chans", 3)
        inp = self._session.get_inputs()[0]
        self.input_name = inp.name
        self.input_shape = list(inp.shape)  # symbolic dims are strings
        self.output_names = [o.name for o in self._session.get_outputs()]
        self._closed = False

    # -- running ---------------------------------------------------------------------
    def run(self, pixel_values: np.ndarray) -> np.ndarray:
        """(B, C, H, W) float32 normalised pixels -> logits (B, classes)."""
        return self.run_all(pixel_values)[LOGITS_NAME if LOGITS_NAME in self.output_names
                                          else self.output_names[0]]

    def run_all(self, pixel_values: np.ndarray) -> dict[str, np.ndarray]:
        """All outputs by name."""
        if self._closed:
            raise RuntimeError("this ViTSession is closed")
        x = self.check_input(pixel_values)
        outs = self._session.run(None, {self.input_name: x})
        return dict(zip(self.output_names, outs))

    def check_input(self, x: Any) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise InputError(f"expected a numpy array (B, C, H, W), got {type(x).__name__}")
        if x.ndim != 4:
            raise InputError(f"expected a 4-D array (B, C, H, W), got shape {x.shape}")
        if not np.issubdtype(x.dtype, np.floating):
            raise InputError(f"expected float32 normalised pixels, got dtype {x.dtype} "
                             f"(preprocess images first)")
        B, C, H, W = x.shape
        if B < 1:
            raise InputError(f"batch must hold at least one image, got shape {x.shape}")
        if C != self.in_chans:
            raise InputError(f"expected {self.in_chans} channels, got {C} (shape {x.shape})")
        static = self.input_shape[2:]
        if all(isinstance(d, int) for d in static) and (H, W) != tuple(static):
            raise InputError(f"this model is static at {static[0]}x{static[1]}, got {H}x{W}")
        if self.patch_size:
            try:
                check_input_size(H, W, self.patch_size)
            except ValueError as e:
                raise InputError(str(e)) from None
        return np.ascontiguousarray(x, dtype=np.float32)

    # -- lifecycle -------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True
        self._session = None  # type: ignore[assignment]

    def __enter__(self) -> ViTSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ViTSession({str(self.model_path)!r}, precision={self.precision!r}, "
                f"providers={[short_name(p) for p in self.providers]})")


def _create_session(path: Path, requested: list[Provider], options: ort.SessionOptions,
                    fallback: bool) -> ort.InferenceSession:
    listed = available()
    missing = [p.name for p in requested if p.name not in listed]
    if missing and not fallback:
        raise ProviderError(f"provider(s) {[short_name(m) for m in missing]} asked for, but this "
                            f"onnxruntime build lists only {[short_name(a) for a in listed]}")
    usable = [p for p in requested if p.name in listed] or [Provider(CPU)]
    try:
        session = ort.InferenceSession(str(path), options,
                                       providers=[(p.name, p.options) for p in usable])
    except Exception as e:  # ORT raises its own Fail / InvalidGraph / ... types
        raise BundleError(f"onnxruntime could not load {str(path)!r}: {e}") from None
    active = session.get_providers()
    inactive = [p.name for p in requested if p.name not in active]
    if inactive:
        message = (f"provider(s) {[short_name(p) for p in inactive]} asked for but not active; "
                   f"active: {[short_name(a) for a in active]}; listed by this onnxruntime: "
                   f"{[short_name(a) for a in listed]} (listed is not the same as usable: check "
                   f"the provider's libraries and onnxruntime's log above)")
        if not fallback:
            raise ProviderError(message)
        warnings.warn(f"falling back: {message}", RuntimeWarning, stacklevel=3)
    return session
