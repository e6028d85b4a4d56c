"""The ONNX Runtime session under a ViTSession: RuntimeOptions and the session options
they make, creating the session with the providers checked after it (strict or a stated
fallback), and the config the exporter stored in the model file against the manifest."""

from __future__ import annotations

import numbers
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import METADATA_CONFIG_KEY
from vit_deploy.runtime.graph_cache import OptimizedGraphCache
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.contract import MAX_THREADS
from vit_deploy.runtime.errors import require_arg
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.providers import (CPU, Provider, ProviderError, available,
                                          captured_stderr, failure_reason, short_name)


OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


FLOAT_PRECISIONS = ("f32", "bf16")  # RuntimeOptions.float_precision


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """Session settings. The defaults are what measured fastest on CPU (docs/cpu-speed.md).
    OpenVINO (runtime/ov_session.py) takes threads (its INFERENCE_NUM_THREADS) and the
    checks; optimization, cache_optimized, io_binding and spinning are ONNX Runtime's."""

    threads: int | None = None  # intra-op threads; None: the engine's default (all cores)
    optimization: str = "all"  # disable | basic | extended | all
    cache_optimized: bool = False  # save ORT's optimised graph beside the model, reuse it later
    io_binding: bool = False  # bind inputs/outputs to the provider's device (CUDA)
    device_id: int = 0
    verify: bool = True  # check the bundle files' sha256 against the manifest
    reject_nonfinite: bool = False  # NaN / Inf in an input is an InputError
    spinning: bool | None = None  # intra-op threads spin while idle; None: ORT's default (on)
    # Dynamic int8 computes one activation scale per tensor, i.e. over the whole batch, so
    # an image's output would depend on its batch-mates. None: run such models one image
    # at a time (outputs independent of batching); False: batch anyway.
    split_batches: bool | None = None
    allow_large: bool = False  # run sizes whose attention estimate exceeds available memory
    # OpenVINO: a model compiled for each input shape met (the last STATIC_SHAPES_KEPT kept)
    # instead of one dynamic model; None: the engine's choice (ov_session.py)
    static_shapes: bool | None = None
    # OpenVINO: the precision of what is not int8. "bf16" on CPUs with AMX or AVX-512 BF16
    # (measured on the trained DINOv2-S and real photographs: int8-static stays within the int8
    # policy, docs/cpu-speed.md); "f32" as ONNX Runtime. ONNX Runtime's providers refuse bf16.
    float_precision: str = "f32"

    def __post_init__(self) -> None:
        for name in ("cache_optimized", "io_binding", "verify", "reject_nonfinite",
                     "allow_large"):
            require_arg(f"RuntimeOptions({name})", getattr(self, name), bool, "True or False")
        for name in ("spinning", "split_batches", "static_shapes"):
            if getattr(self, name) is not None:
                require_arg(f"RuntimeOptions({name})", getattr(self, name), bool,
                            "True, False or None")
        require_arg("RuntimeOptions(device_id)", self.device_id, int, "a device index >= 0")
        if self.device_id < 0:
            raise ValueError(f"RuntimeOptions(device_id) must be >= 0, got {self.device_id}")
        if self.float_precision not in FLOAT_PRECISIONS:
            raise ValueError(f"float_precision must be one of {list(FLOAT_PRECISIONS)}, got "
                             f"{self.float_precision!r}"[:200])
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise ValueError(f"optimization must be one of {list(OPTIMIZATION_LEVELS)}, got "
                             f"{self.optimization!r}")
        t = self.threads
        if t is not None and not (isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                  and 1 <= t <= MAX_THREADS):
            raise ValueError(f"threads must be an integer from 1 to {MAX_THREADS} (or None: "
                             f"ONNX Runtime's default), got {t!r}"[:200])
        if t is not None:
            object.__setattr__(self, "threads", int(t))  # a numpy integer as ORT takes it


def _check_manifest_against_model(manifest: Manifest, stored: ViTConfig | None,
                                  path: Path) -> None:
    """The manifest's claims against the config the exporter wrote into the model file's
    own metadata (absent in a foreign file: nothing to compare)."""
    if stored is None:
        return
    for what, claimed, real in (("patch size", manifest.io.patch_size, stored.patch_size),
                                ("input channels", manifest.config.in_chans, stored.in_chans)):
        if claimed != real:
            raise BundleError(f"the manifest says {what} {claimed}, but {str(path)!r} was "
                              f"exported with {what} {real} (its metadata "
                              f"{METADATA_CONFIG_KEY!r}); the manifest does not describe "
                              f"this model")


def _config_from_metadata(session: ort.InferenceSession) -> ViTConfig | None:
    """The config our exporter stores in every model's metadata; None in a foreign file."""
    text = session.get_modelmeta().custom_metadata_map.get(METADATA_CONFIG_KEY)
    if text is None:
        return None
    try:
        return ViTConfig.from_json(text)
    except (TypeError, ValueError) as e:
        raise BundleError(f"the model's stored vit-deploy config is not valid: {e}") from None


def _session_options(options: RuntimeOptions) -> ort.SessionOptions:
    so = ort.SessionOptions()
    if options.threads is not None:
        so.intra_op_num_threads = options.threads
    so.graph_optimization_level = OPTIMIZATION_LEVELS[options.optimization]
    if options.spinning is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning",
                                    "1" if options.spinning else "0")
    return so


def _create_session(path: Path, requested: list[Provider], options: RuntimeOptions,
                    fallback: bool) -> tuple[ort.InferenceSession, str | None, bool]:
    """A session on the providers asked for. One provider is strict: ProviderError unless
    it is active. A list is an order of preference: the session runs on the first active
    one (warning, with ONNX Runtime's reason, when that is not the first asked for), and is
    a ProviderError only when none of them is. `fallback` also allows what ORT falls back
    to (its CPU provider) when none of them is."""
    if options.float_precision != "f32":  # never a silently other precision
        raise ProviderError(f"float_precision {options.float_precision} is OpenVINO's setting "
                            f"(provider openvino); ONNX Runtime's providers "
                            f"{[short_name(p.name) for p in requested]} run what is not int8 "
                            f"in float32")
    listed = available()
    missing = [p.name for p in requested if p.name not in listed]
    usable = [p for p in requested if p.name in listed]
    if not usable and not fallback:
        raise ProviderError(f"provider(s) {[short_name(m) for m in missing]} asked for, but this "
                            f"onnxruntime build lists only {[short_name(a) for a in listed]}")
    usable = usable or [Provider(CPU)]
    so = _session_options(options)
    cache = (OptimizedGraphCache(path, usable, options.optimization)
             if options.cache_optimized else None)
    source = cache.prepare(so) if cache else str(path)
    with captured_stderr() as log:
        try:
            session = ort.InferenceSession(source, so, providers=[(p.name, p.options) for p in usable])
        except Exception as e:  # ORT raises its own Fail / InvalidGraph / ... types
            error: Exception | None = e
        else:
            error = None
    if error is not None:
        raise BundleError(f"onnxruntime could not load {str(path)!r}: {error}") from None
    active = session.get_providers()
    inactive = [p.name for p in requested if p.name not in active]
    reason = None
    if inactive:
        why = "; ".join(part for part in (
            [f"{[short_name(m) for m in missing]} not in this onnxruntime build"] if missing
            else []) + ([failure_reason(log[0])] if len(missing) < len(inactive) else [])
            if part) or "no reason given"
        reason = (f"provider(s) {[short_name(p) for p in inactive]} asked for but not active; "
                  f"active: {[short_name(a) for a in active]}; listed by this onnxruntime: "
                  f"{[short_name(a) for a in listed]}; onnxruntime says: {why}")
        preferred = [p.name for p in requested if p.name in active]
        if not preferred and not fallback:
            raise ProviderError(reason if len(requested) == 1 else
                                f"none of the providers asked for is active: {reason}")
        if requested[0].name not in active:  # not the first choice: say so
            ran = short_name(active[0])
            warnings.warn(f"running on {ran}"
                          f"{' (the next in your order of preference)' if preferred else ''}: "
                          f"{reason}", RuntimeWarning, stacklevel=3)
    elif log[0].strip():
        sys.stderr.write(log[0])  # nothing failed: do not hide what ORT said
    if cache and not inactive:
        cache.store()
    return session, reason, bool(cache and cache.hit)
