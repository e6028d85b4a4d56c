"""TensorRT execution-provider options built from a bundle (torch-free, testable as data).

- **Profiles**: TensorRT builds an engine for a range of input shapes. A bucket graph is
  static: min = opt = max = its shape. The dynamic graph gets the range the bundle
  declares: from the smallest to the largest of its deploy, native and bucket sizes (each
  side on its own), batch 1 to `max_batch`, optimised for the deploy size at batch 1.
- **Engine and timing caches** inside the bundle's cache folder (`.ort-cache/tensorrt/`,
  the folder the runtime already keeps ORT's optimised graphs in; it is the user's, kept
  across rewrites), one sub-folder per key: GPU name, TensorRT version, precision and a
  digest of the profile. A cache built on another GPU, another TensorRT, another
  precision or another shape range lands in another folder, so it is never reused.
- **fp16** with LayerNorm kept in fp32 (`trt_layer_norm_fp32_fallback`: the most reported
  TensorRT fp16 ViT failure is LayerNorm overflow); **int8-static** (QDQ) with
  `trt_int8_enable`, the scales coming from the Q/DQ nodes (no calibration table).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_deploy.runtime.contract import INPUT_NAME
from vit_deploy.runtime.graph_cache import CACHE_DIR
from vit_deploy.runtime.manifest import Manifest, bundle_path
from vit_deploy.runtime.providers import Provider

TENSORRT = "TensorrtExecutionProvider"
TRT_DIR = "tensorrt"
TRT_PRECISIONS = ("fp32", "fp16", "int8-static")  # dynamic int8 / int4 use contrib ops TensorRT lacks

Shape = tuple[int, int, int, int]


@dataclass(frozen=True)
class Profile:
    """One TensorRT optimisation profile of the input `pixel_values` (B, C, H, W)."""

    min: Shape
    opt: Shape
    max: Shape

    def __post_init__(self) -> None:
        if not all(a <= b <= c for a, b, c in zip(self.min, self.opt, self.max)):
            raise ValueError(f"profile needs min <= opt <= max per dim, got {self.min}, "
                             f"{self.opt}, {self.max}")

    def options(self, name: str = INPUT_NAME) -> dict[str, str]:
        text = lambda s: f"{name}:{'x'.join(map(str, s))}"  # noqa: E731
        return {"trt_profile_min_shapes": text(self.min), "trt_profile_opt_shapes": text(self.opt),
                "trt_profile_max_shapes": text(self.max)}

    def digest(self) -> str:
        return hashlib.sha256(repr((self.min, self.opt, self.max)).encode()).hexdigest()[:12]


def static_profile(batch: int, channels: int, hw: tuple[int, int]) -> Profile:
    shape = (batch, channels, *hw)
    return Profile(shape, shape, shape)  # type: ignore[arg-type]


def dynamic_profile(manifest: Manifest, *, max_batch: int = 8) -> Profile:
    """The range the bundle declares for its dynamic graph (see module doc)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    C = manifest.config.in_chans
    deploy = manifest.deploy_resolution
    if not manifest.io.dynamic:
        return Profile((1, C, *deploy), (1, C, *deploy), (max_batch, C, *deploy))
    sizes = {deploy, manifest.native_resolution}
    for target in manifest.targets.values():
        sizes.update(target.resolutions)
    hs, ws = [h for h, _ in sizes], [w for _, w in sizes]
    return Profile((1, C, min(hs), min(ws)), (1, C, *deploy), (max_batch, C, max(hs), max(ws)))


def cache_key(gpu: str, trt_version: str, precision: str, profile: Profile) -> str:
    """A folder name that differs whenever a cache could not be reused."""
    slug = lambda s: re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-")[:60] or "unknown"  # noqa: E731
    return f"{slug(gpu)}-trt{slug(trt_version)}-{precision}-{profile.digest()}"


def tensorrt_options(bundle: str | Path, precision: str, profile: Profile, *, gpu: str,
                     trt_version: str, device_id: int = 0) -> dict[str, Any]:
    """TensorrtExecutionProvider options for one graph of the bundle at `bundle`."""
    if precision not in TRT_PRECISIONS:
        raise ValueError(f"TensorRT runs {list(TRT_PRECISIONS)} here, not {precision!r} "
                         f"(dynamic int8 and int4 are ONNX Runtime contrib ops)")
    cache = Path(bundle) / CACHE_DIR / TRT_DIR / cache_key(gpu, trt_version, precision, profile)
    return {
        "device_id": device_id,
        "trt_fp16_enable": precision == "fp16",
        "trt_layer_norm_fp32_fallback": precision == "fp16",
        "trt_int8_enable": precision == "int8-static",
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(cache),
        **profile.options(),
    }


def gpu_identity(device_id: int = 0) -> tuple[str, str]:
    """(GPU name, TensorRT version) of this machine; 'unknown' for what cannot be read
    (the key then still differs from a known one)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i",
                              str(device_id)], capture_output=True, text=True, timeout=10)
        gpu = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() \
            else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        gpu = "unknown"
    try:
        import tensorrt  # type: ignore[import-not-found]

        version = str(tensorrt.__version__)
    except ImportError:
        from importlib import metadata

        version = "unknown"
        for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_libs",
                     "tensorrt-cu12-libs", "tensorrt-cu13-libs"):
            try:
                version = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return gpu, version


def tensorrt_defaults(requested: list[Provider], bundle: str | Path, manifest: Manifest,
                      precision: str, *, graph: Path | None = None) -> list[Provider]:
    """`requested` with options filled in for a TensorRT provider asked for without any:
    the profile of `graph` (a bucket graph of the bundle: static) or of the dynamic graph,
    and caches keyed by this machine's GPU and TensorRT. Options given are kept as given."""
    if precision not in TRT_PRECISIONS or not any(
            p.name == TENSORRT and not p.options for p in requested):
        return requested
    profile = dynamic_profile(manifest)
    if graph is not None:
        for target in manifest.targets.values():
            for g in target.graphs:
                if bundle_path(bundle, g.file) == Path(graph).resolve():
                    profile = static_profile(g.batch, manifest.config.in_chans, g.resolution)
    gpu, version = gpu_identity()
    options = tensorrt_options(bundle, precision, profile, gpu=gpu, trt_version=version)
    return [Provider(p.name, options) if p.name == TENSORRT and not p.options else p
            for p in requested]
