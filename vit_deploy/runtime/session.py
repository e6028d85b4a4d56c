"""ViTSession: run a bundle (or one .onnx file) with ONNX Runtime. No torch here."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from vit_deploy.contract import FEATURES_NAME, LOGITS_NAME, METADATA_CONFIG_KEY
from vit_deploy.runtime.manifest import BundleError, load_manifest, sha256_file
from vit_deploy.runtime.preprocess import ImageInput, Preprocess
from vit_deploy.runtime.providers import (CPU, Provider, ProviderError, ProviderSpec, available,
                                          captured_stderr, failure_reason, parse_providers,
                                          short_name)
from vit_deploy.sizes import MemoryEstimateError, check_input_size, check_memory

OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
CACHE_DIR = ".ort-cache"


class InputError(ValueError):
    """An input array the model cannot take: says what was expected and what was given."""


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """Session settings. The defaults are what measured fastest on CPU (DESIGN.md)."""

    threads: int | None = None  # intra-op threads; None: ONNX Runtime's default (all cores)
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

    def __post_init__(self) -> None:
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise ValueError(f"optimization must be one of {list(OPTIMIZATION_LEVELS)}, got "
                             f"{self.optimization!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


@dataclass(frozen=True)
class Classified:
    index: int
    label: str | None
    probability: float


@dataclass(frozen=True)
class Prediction:
    source: str  # what was given: a path, or a description of the object
    input_size: tuple[int, int]  # (H, W) the model saw
    top: list[Classified]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "input_size": list(self.input_size),
                "top": [c.__dict__ for c in self.top]}


class ViTSession:
    """A context-managed ONNX Runtime session over a bundle directory or a .onnx file.

    Providers are checked after the session is created: asking for one that is not
    active is a ProviderError (strict, the default) naming what was asked, what is
    active and ONNX Runtime's reason; with fallback=True the session runs on what is
    active, warns, and `providers` says what really runs. Safe to share between threads.
    """

    def __init__(self, model: str | Path, *, provider: ProviderSpec | Sequence[ProviderSpec] = "cpu",
                 precision: str = "fp32", fallback: bool = False,
                 options: RuntimeOptions = RuntimeOptions()):
        path = Path(model)
        self.options = options
        self.manifest: dict[str, Any] | None = None
        if path.is_dir():
            self.manifest = load_manifest(path, verify=options.verify)
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
        self.batch_coupled = _inspect_model(self.model_path, self.manifest)
        self._session, self.fallback_reason, self.cache_hit = _create_session(
            self.model_path, self.requested, options, fallback)
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
        self.labels: list[str] | None = (self.manifest or {}).get("labels")
        self.split_batches = (self.batch_coupled if options.split_batches is None
                              else options.split_batches)
        self._placement: dict[str, list[str]] | None = None

    # -- running ---------------------------------------------------------------------
    def run(self, pixel_values: np.ndarray) -> np.ndarray:
        """(B, C, H, W) float32 normalised pixels -> logits (B, classes)."""
        outs = self.run_all(pixel_values)
        return outs[LOGITS_NAME] if LOGITS_NAME in outs else outs[self.output_names[0]]

    def features(self, pixel_values: np.ndarray) -> np.ndarray:
        """Pooled features (B, width); the bundle must have been exported with --features."""
        if FEATURES_NAME not in self.output_names:
            raise BundleError(f"{str(self.model_path)!r} has no {FEATURES_NAME!r} output (outputs: "
                              f"{self.output_names}); export with --features")
        return self.run_all(pixel_values)[FEATURES_NAME]

    def run_all(self, pixel_values: np.ndarray) -> dict[str, np.ndarray]:
        """All outputs by name."""
        x = self.check_input(pixel_values)
        session = self._live()
        if self.split_batches and len(x) > 1:
            parts = [self._run_checked(session, x[i:i + 1]) for i in range(len(x))]
            return {name: np.concatenate([p[name] for p in parts]) for name in self.output_names}
        return self._run_checked(session, x)

    def _run_checked(self, session: ort.InferenceSession, x: np.ndarray) -> dict[str, np.ndarray]:
        if self.options.io_binding:
            return dict(zip(self.output_names, self._run_bound(session, x)))
        return dict(zip(self.output_names, session.run(None, {self.input_name: x})))

    def _run_bound(self, session: ort.InferenceSession, x: np.ndarray) -> list[np.ndarray]:
        """IO binding: the input is copied to the provider's device once and the outputs
        stay there until the end (one binding per call, so threads do not share one)."""
        device = "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        binding = session.io_binding()
        value = ort.OrtValue.ortvalue_from_numpy(x, device, self.options.device_id)
        binding.bind_ortvalue_input(self.input_name, value)
        for name in self.output_names:
            binding.bind_output(name, device, self.options.device_id)
        session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()

    def predict(self, images: ImageInput | Sequence[ImageInput], *, top_k: int = 5,
                preprocess: Preprocess | None = None) -> list[Prediction]:
        """Classify images (paths, bytes, PIL images, HWC uint8 arrays) with the manifest's
        preprocessing; same-size images run as one batch."""
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if isinstance(images, (str, os.PathLike, bytes, bytearray, np.ndarray)) or hasattr(images, "getpixel"):
            images = [images]  # type: ignore[list-item]
        images = list(images)  # type: ignore[arg-type]
        pre = preprocess or self.preprocess()
        results: list[Prediction | None] = [None] * len(images)
        for indices, batch in pre.batches(images):
            for row, i in zip(self.classify(batch, top_k), indices):
                results[i] = Prediction(_describe(images[i]), tuple(batch.shape[2:]), row)
        return results  # type: ignore[return-value]

    def classify(self, batch: np.ndarray, top_k: int) -> list[list[Classified]]:
        """Normalised (B, C, H, W) -> the top-k classes of each image, best first."""
        probs = softmax(self.run(batch))
        k = min(top_k, probs.shape[1])
        return [[Classified(int(j), self.labels[j] if self.labels else None, float(row[j]))
                 for j in np.argsort(-row, kind="stable")[:k]] for row in probs]

    def preprocess(self, **overrides: Any) -> Preprocess:
        """The manifest's preprocessing (a bare .onnx file has none: pass the fields)."""
        if self.manifest is None:
            try:
                return Preprocess(patch_size=self.patch_size, **overrides)
            except TypeError:
                raise BundleError(f"{str(self.model_path)!r} is a bare .onnx file without a "
                                  f"manifest: pass resolution, mean and std") from None
        return Preprocess.from_manifest(self.manifest, **overrides)

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
        if self.patch_size and not self.options.allow_large and "heads" in self.config:
            try:
                check_memory(H, W, patch=self.patch_size, heads=self.config["heads"],
                             width_dim=self.config.get("width", 0),
                             batch=1 if self.split_batches else B,
                             prefix=int(self.config.get("class_token", True)))
            except MemoryEstimateError as e:
                raise InputError(str(e)) from None
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.options.reject_nonfinite and not np.isfinite(x).all():
            raise InputError(f"input holds {int((~np.isfinite(x)).sum())} NaN/Inf values")
        return x

    # -- introspection ---------------------------------------------------------------
    def placement(self) -> dict[str, list[str]]:
        """Which provider ran each node, from ONNX Runtime's own profile of one small run:
        {provider alias: [node names]}. Nodes on 'cpu' while another provider was asked
        for are the ones that fell back."""
        if self._placement is None:
            self._placement = _profile_placement(self)
        return self._placement

    def cpu_fallback_nodes(self) -> list[str]:
        if self.requested[0].name == CPU:
            return []
        return self.placement().get("cpu", [])

    def describe(self) -> dict[str, Any]:
        return {"model": str(self.model_path), "precision": self.precision,
                "requested": [short_name(p.name) for p in self.requested],
                "active": [short_name(p) for p in self.providers],
                "fallback": self.fallback_reason, "input": [self.input_name, self.input_shape],
                "batch_coupled": self.batch_coupled, "split_batches": self.split_batches,
                "outputs": self.output_names}

    # -- lifecycle -------------------------------------------------------------------
    def _live(self) -> ort.InferenceSession:
        session = self._session
        if session is None:
            raise RuntimeError("this ViTSession is closed")
        return session

    def close(self) -> None:
        self._session = None  # type: ignore[assignment]

    def __enter__(self) -> ViTSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ViTSession({str(self.model_path)!r}, precision={self.precision!r}, "
                f"providers={[short_name(p) for p in self.providers]})")


# Both batch-coupling ops (DynamicQuantizeLinear, DynamicQuantizeMatMul) contain this name;
# each needle costs a full pass over the file (0.12 s for ViT-B/16 fp32).
_COUPLING_OP = b"DynamicQuantize"


def _inspect_model(path: Path, manifest: dict[str, Any] | None) -> bool:
    """Before ORT opens the file: refuse external data outside the model's directory (or,
    in a bundle, not covered by the manifest's hashes). Returns whether the graph quantises
    activations per tensor at run time (batch-coupled).

    The file is first scanned in chunks for the strings that external data and the
    batch-coupling ops must contain; the protobuf is parsed only when one is present
    (parsing a 85 MB model up front cost 35 MB of peak memory per session)."""
    found = _file_contains(path, (b"location", _COUPLING_OP))
    if b"location" in found:
        _check_external_data(path, manifest)
    return _COUPLING_OP in found


def _file_contains(path: Path, needles: tuple[bytes, ...], chunk: int = 1 << 20) -> set[bytes]:
    found: set[bytes] = set()
    keep = max(len(n) for n in needles) - 1
    tail = b""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            window = tail + block
            found.update(n for n in needles if n in window)
            tail = window[-keep:]
    return found


def _check_external_data(path: Path, manifest: dict[str, Any] | None) -> None:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and friends: a truncated or foreign file
        raise BundleError(f"{str(path)!r} is not a readable ONNX model: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    root = path.parent.resolve()
    listed = set((manifest or {}).get("files", {}))
    tensors = list(model.graph.initializer) + [
        a.t for n in model.graph.node for a in n.attribute if a.HasField("t")]
    for tensor in tensors:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        target = (root / location).resolve()
        if root not in target.parents:
            raise BundleError(f"{str(path)!r}: tensor {tensor.name!r} points to external data "
                              f"{location!r}, outside the model's directory; refused")
        if manifest is not None and target.relative_to(root).as_posix() not in listed:
            raise BundleError(f"{str(path)!r}: external data {location!r} is not listed (and "
                              f"hashed) in the manifest; refused")


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _describe(image: Any) -> str:
    if isinstance(image, (str, os.PathLike)):
        return str(image)
    if isinstance(image, np.ndarray):
        return f"<array {image.shape} {image.dtype}>"
    if isinstance(image, (bytes, bytearray)):
        return f"<{len(image)} bytes>"
    return f"<{type(image).__name__} {getattr(image, 'size', '')}>"


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
    listed = available()
    missing = [p.name for p in requested if p.name not in listed]
    if missing and not fallback:
        raise ProviderError(f"provider(s) {[short_name(m) for m in missing]} asked for, but this "
                            f"onnxruntime build lists only {[short_name(a) for a in listed]}")
    usable = [p for p in requested if p.name in listed] or [Provider(CPU)]
    so = _session_options(options)
    cache = OptimizedGraphCache(path, usable, options) if options.cache_optimized else None
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
        why = failure_reason(log[0]) if not missing else "not in this onnxruntime build"
        reason = (f"provider(s) {[short_name(p) for p in inactive]} asked for but not active; "
                  f"active: {[short_name(a) for a in active]}; listed by this onnxruntime: "
                  f"{[short_name(a) for a in listed]}; onnxruntime says: {why}")
        if not fallback:
            raise ProviderError(reason)
        warnings.warn(f"falling back: {reason}", RuntimeWarning, stacklevel=3)
    elif log[0].strip():
        sys.stderr.write(log[0])  # nothing failed: do not hide what ORT said
    if cache and not inactive:
        cache.store()
    return session, reason, bool(cache and cache.hit)


class OptimizedGraphCache:
    """ORT's optimised graph saved beside the model (`.ort-cache/`) for a faster next start.

    Keyed by model, providers, optimisation level and ORT version; used only when its
    sidecar says it was made from this very model file and its own hash still matches.
    """

    def __init__(self, path: Path, providers: list[Provider], options: RuntimeOptions):
        key = "-".join(p.alias for p in providers)
        self.model = path
        self.graph = path.parent / CACHE_DIR / f"{path.stem}.{key}.{options.optimization}.ort{ort.__version__}.onnx"
        self.sidecar = self.graph.with_suffix(".json")
        self._fresh: str | None = None
        self._source_hash = ""
        self.hit = False

    def prepare(self, so: ort.SessionOptions) -> str:
        """The file to load; sets `so` to load the cached graph or to write a new one."""
        self._source_hash = sha256_file(self.model)
        try:
            record = json.loads(self.sidecar.read_text())
            if (record["source_sha256"] == self._source_hash
                    and sha256_file(self.graph) == record["sha256"]):
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                self.hit = True
                return str(self.graph)
        except (OSError, ValueError, KeyError):
            pass
        try:
            self.graph.parent.mkdir(exist_ok=True)
            fd, self._fresh = tempfile.mkstemp(prefix=".opt-", suffix=".onnx", dir=self.graph.parent)
            os.close(fd)
        except OSError as e:
            warnings.warn(f"cannot cache the optimised graph beside {str(self.model)!r}: {e}",
                          RuntimeWarning, stacklevel=4)
            return str(self.model)
        so.optimized_model_filepath = self._fresh
        return str(self.model)

    def store(self) -> None:
        fresh, self._fresh = self._fresh, None
        if fresh is None:
            return
        if os.path.getsize(fresh) == 0:
            os.unlink(fresh)
            return
        os.replace(fresh, self.graph)
        record = {"source_sha256": self._source_hash, "sha256": sha256_file(self.graph),
                  "onnxruntime": ort.__version__}
        tmp = self.sidecar.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.sidecar)


def _profile_placement(s: ViTSession) -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        so = _session_options(s.options)
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "placement")
        providers = [(p, opts) for p, opts in zip(s.providers, _options_for(s))]
        with captured_stderr():
            session = ort.InferenceSession(str(s.model_path), so, providers=providers)
        static = s.input_shape[2:]
        P = s.patch_size or 1
        hw = tuple(static) if all(isinstance(d, int) for d in static) else (P, P)
        session.run(None, {s.input_name: np.zeros((1, s.in_chans, *hw), np.float32)})
        with open(session.end_profiling()) as f:
            events = json.load(f)
    out: dict[str, list[str]] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            provider = short_name(e["args"].get("provider", "?"))
            out.setdefault(provider, []).append(e["name"][: -len("_kernel_time")])
    return out


def _options_for(s: ViTSession) -> list[dict[str, Any]]:
    by_name = {p.name: p.options for p in s.requested}
    return [by_name.get(p, {}) for p in s.providers]
