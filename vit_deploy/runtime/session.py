"""ViTSession: run a bundle (or one .onnx file) with ONNX Runtime, or OpenVINO where it is
asked for (runtime/ov_session.py). No torch here."""

from __future__ import annotations

import dataclasses
import numbers
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import FEATURES_NAME, LOGITS_NAME, PATCH_TOKENS_NAME
from vit_deploy.runtime.buckets import BucketRunner, resolve_target
from vit_deploy.runtime.cpu import VNNI_CPU, int8_warning, meets
from vit_deploy.runtime.embedding import embed_images, not_a_classifier, purpose_of
from vit_deploy.runtime.manifest import Manifest, load_manifest
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.model_scan import inspect_model, int8_weights_need
from vit_deploy.runtime.naflex.contract import METADATA_NAFLEX_KEY, NAFLEX_NOT_VIT
from vit_deploy.runtime.ort_session import (RuntimeOptions, _check_manifest_against_model,
                                            _config_from_metadata, _session_options)
from vit_deploy.runtime.ov_session import create_session
from vit_deploy.runtime.placement import profile_placement
from vit_deploy.runtime.preprocess import ImageInput, Preprocess
from vit_deploy.runtime.providers import (CPU, ProviderSpec, is_openvino, parse_providers,
                                          short_name)
from vit_deploy.runtime.results import (Classified, Prediction, _check_labels, probabilities,
                                        require_finite)
from vit_deploy.runtime.swap import recover_on_open
from vit_deploy.runtime.tensorrt import tensorrt_defaults
from vit_deploy.runtime.sizes import MemoryEstimateError, guard_memory, require_patch_multiple
from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError, require_arg


class InputError(VitDeployError, ValueError):
    """An input array the model cannot take: says what was expected and what was given."""

    exit_code = BAD_INPUT


class ViTSession:
    """A context-managed ONNX Runtime (or OpenVINO) session over a bundle directory or a
    .onnx file.

    Providers are checked after the session is created. One provider is strict: if it is
    not active, a ProviderError names what was asked, what is active and ONNX Runtime's
    reason. A list ('cuda,cpu') is an order of preference: the session runs on the first
    active one, warns when that is not the first asked for, and fails only when none is.
    fallback=True also runs on what ONNX Runtime falls back to (CPU) when none is.
    'openvino' (openvino-gpu, openvino:DEVICE) is the OpenVINO engine, in a list like any
    provider ('openvino,cpu'). `providers` says what really runs. Safe to share between
    threads.
    """

    def __init__(self, model: str | Path, *, provider: ProviderSpec | Sequence[ProviderSpec] = "cpu",
                 precision: str = "fp32", fallback: bool = False,
                 options: RuntimeOptions = RuntimeOptions(), target: str | None = "auto"):
        require_arg("ViTSession(model)", model, (str, os.PathLike), "a bundle directory or "
                    ".onnx file path (str or os.PathLike)")
        require_arg("precision", precision, str, "a precision name such as 'fp32' or 'int8'")
        require_arg("fallback", fallback, bool, "True or False")
        require_arg("options", options, RuntimeOptions, "a RuntimeOptions(...)")
        if target is not None:
            require_arg("target", target, str, "a target name, 'auto' or None")
        path = Path(model)
        recover_on_open(path)  # before is_dir: a writer killed mid-swap may have moved it aside
        self.options = options
        self.manifest: Manifest | None = None
        if path.is_dir():
            self.manifest = load_manifest(path, verify=options.verify)
            if self.manifest.naflex:
                raise BundleError(NAFLEX_NOT_VIT.format(path=str(path)))
            self.model_path = self.manifest.model_path(path, precision)
        elif path.is_file():
            self.model_path = path
        else:
            raise FileNotFoundError(f"no bundle directory or .onnx file at {str(path)!r}")
        self.precision = precision
        self.requested = parse_providers(provider)
        if self.manifest is not None:  # TensorRT without options: profiles and caches from the bundle
            self.requested = tensorrt_defaults(self.requested, path, self.manifest, precision)
        self.batch_coupled = inspect_model(
            self.model_path, set(self.manifest.files) if self.manifest else None)
        self._session, self.fallback_reason, self.cache_hit = create_session(
            self.model_path, self.requested, options, fallback)
        self.providers: list[str] = self._session.get_providers()
        # what runs it, with its version: 'onnxruntime 1.31.1' or 'openvino 2026.4.1'
        self.engine = (f"openvino {self._session.version}" if self.openvino
                       else f"onnxruntime {ort.__version__}")
        if METADATA_NAFLEX_KEY in self._session.get_modelmeta().custom_metadata_map:
            raise BundleError(NAFLEX_NOT_VIT.format(path=str(path)))
        stored = _config_from_metadata(self._session)  # what the exporter wrote into the file
        if self.manifest is not None:
            _check_manifest_against_model(self.manifest, stored, self.model_path)
        self.config: ViTConfig | None = self.manifest.config if self.manifest else stored
        # int8 with 8-bit weights saturates on x86 CPUs with AVX2 only (runtime/cpu.py): on
        # a CPU that could, the file's own weights say, not the recipe (a file swapped in
        # or re-quantised by hand, a bare file without a manifest)
        need = self.manifest.int8_cpu(precision) if self.manifest else None
        if self.providers[0] == "CPUExecutionProvider" and meets(VNNI_CPU) is not True:
            need = int8_weights_need(self.model_path) or need
        self.cpu_warning = int8_warning(need, self.providers[0])
        if self.cpu_warning:
            warnings.warn(self.cpu_warning, RuntimeWarning, stacklevel=2)
        self.patch_size: int | None = self.config.patch_size if self.config else None
        inp = self._session.get_inputs()[0]
        self.in_chans: int = (self.config.in_chans if self.config else
                              inp.shape[1] if isinstance(inp.shape[1], int) else 3)
        self.input_name = inp.name
        self.input_shape = list(inp.shape)  # symbolic dims are strings
        self.output_names = [o.name for o in self._session.get_outputs()]
        self.labels: tuple[str, ...] | None = self.manifest.labels if self.manifest else None
        # The labels against the logits' real width (the graph's, not the manifest's), where
        # the graph fixes it; otherwise classify() checks every result.
        logits = next((o for o in self._session.get_outputs() if o.name == LOGITS_NAME), None)
        width = logits.shape[-1] if logits is not None and logits.shape else None
        if self.labels is not None and isinstance(width, int):
            _check_labels(self.labels, width, LOGITS_NAME, self.model_path)
        self.split_batches = (self.batch_coupled if options.split_batches is None
                              else options.split_batches)
        self._placement: dict[str, list[str]] | None = None
        # Edge-target bucket graphs (`vit-deploy target`): inputs at a bucket's size run on
        # its static graph, others on the dynamic one; target "auto" picks the provider's.
        spec = resolve_target(self.manifest, target, self.providers[0], precision)
        self.buckets: BucketRunner | None = None if spec is None else BucketRunner(
            path, spec, precision, split=self.split_batches, create=lambda p: create_session(
                p, tensorrt_defaults(self.requested, path, self.manifest, precision, graph=p),
                options, fallback)[0])

    # -- running ---------------------------------------------------------------------
    def run(self, pixel_values: np.ndarray) -> np.ndarray:
        """(B, C, H, W) float32 normalised pixels -> logits (B, classes)."""
        outs = self.run_all(pixel_values)
        return outs[LOGITS_NAME] if LOGITS_NAME in outs else outs[self.output_names[0]]

    def pooled(self, pixel_values: np.ndarray) -> np.ndarray:
        """Pooled features (B, width): the `pooled` output (a backbone's default)."""
        return self.run_all(pixel_values)[self._require_output(FEATURES_NAME, "--outputs logits,pooled")]

    def features(self, images: ImageInput | Sequence[ImageInput], *,
                 output: str = PATCH_TOKENS_NAME, preprocess: Preprocess | None = None
                 ) -> np.ndarray:
        """Dense features of images of any size: `output` (patch_tokens, or layer_N) on the
        patch grid, numpy (B, width, grid_h, grid_w).

        Images are resized so the shorter side matches the deploy resolution and both sides
        are patch multiples (the aspect ratio is kept, nothing is cropped), unless
        `preprocess` says otherwise. Images must come out at one size to share a batch.
        """
        self._require_output(output, f"--outputs {output}" if output == PATCH_TOKENS_NAME
                             else "--layers")
        images = _as_list(images)
        if not images:
            raise InputError("no images given")
        pre = self._guarded(preprocess or self.preprocess(resize="patch_multiple"))
        groups = pre.batches(images)
        if len(groups) > 1:
            sizes = [f"{b.shape[2]}x{b.shape[3]}" for _, b in groups]
            raise InputError(f"these images preprocess to {len(groups)} sizes ({', '.join(sizes)}), "
                             f"so their grids differ; call features() once per size, or pass "
                             f"a preprocess with the resize rule shorter_side_center_crop")
        return require_finite(self.run_all(groups[0][1])[output], output)

    def _require_output(self, name: str, how: str) -> str:
        if name not in self.output_names:
            raise BundleError(f"{str(self.model_path)!r} has no {name!r} output (outputs: "
                              f"{self.output_names}); export with {how}")
        return name

    def run_all(self, pixel_values: np.ndarray) -> dict[str, np.ndarray]:
        """All outputs by name."""
        x = self.validate_input(pixel_values)
        session = self._live()
        if self.buckets is not None and self.buckets.covers(x.shape[2:]):
            outs = self.buckets.run(x, self.input_name)
        elif self.split_batches and len(x) > 1:
            parts = [self._run_checked(session, x[i:i + 1]) for i in range(len(x))]
            outs = {name: np.concatenate([p[name] for p in parts]) for name in self.output_names}
        else:
            outs = self._run_checked(session, x)
        for name, out in outs.items():  # every output is batch-first: one row per image
            if out.ndim == 0 or out.shape[0] != len(x):
                raise BundleError(f"{str(self.model_path)!r}: output {name!r} has shape "
                                  f"{list(out.shape)} for a batch of {len(x)} image(s); "
                                  f"expected {len(x)} row(s) (the graph does not keep the batch)")
        return outs

    def _run_checked(self, session: ort.InferenceSession, x: np.ndarray) -> dict[str, np.ndarray]:
        if self.options.io_binding and not self.openvino:  # OpenVINO: inputs are not copied
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
        preprocessing; same-size images run as one batch. With bucket graphs (and no
        `preprocess` given) each image goes to its bucket (runtime/buckets.py)."""
        if not (isinstance(top_k, numbers.Integral) and not isinstance(top_k, bool)
                and top_k >= 1):
            raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}"[:200])
        images = _as_list(images)
        if preprocess is not None:
            require_arg("preprocess", preprocess, Preprocess, "a Preprocess or None")
        pre = self._guarded(preprocess or self.preprocess())
        results: list[Prediction | None] = [None] * len(images)
        groups = (self.buckets.batches(images, pre) if self.buckets is not None and preprocess
                  is None else pre.batches(images))
        for indices, batch in groups:
            for row, i in zip(self.classify(batch, top_k), indices):
                results[i] = Prediction(_describe(images[i]), tuple(batch.shape[2:]), row)
        return results  # type: ignore[return-value]

    def embed(self, images: ImageInput | Sequence[ImageInput], *, normalize: bool = True,
              output: str | None = None, preprocess: Preprocess | None = None) -> np.ndarray:
        """Images (paths, bytes, PIL, HWC uint8 arrays) -> (N, D) float32 vectors of the
        embedding output (`pooled`), unit length with `normalize` (runtime/embedding.py)."""
        return embed_images(self, _as_list(images), normalize=normalize, output=output,
                            preprocess=preprocess)

    def classify(self, batch: np.ndarray, top_k: int) -> list[list[Classified]]:
        """Normalised (B, C, H, W) -> the top-k classes of each image, best first."""
        if (backbone := not_a_classifier(self)) is not None:
            raise backbone
        outs = self.run_all(batch)
        purpose = purpose_of(self)
        name = purpose.classifier or self.output_names[0]
        logits = require_finite(outs[name], name)
        if logits.ndim != 2:
            raise BundleError(f"{str(self.model_path)!r}: output {name!r} has shape "
                              f"{list(logits.shape)}; classifying needs (batch, classes)")
        if self.labels is not None:
            _check_labels(self.labels, logits.shape[1], name, self.model_path)
        probs = probabilities(logits, purpose.probabilities)
        k = min(top_k, probs.shape[1])
        return [[Classified(int(j), self.labels[j] if self.labels else None, float(row[j]))
                 for j in np.argsort(-row, kind="stable")[:k]] for row in probs]

    def preprocess(self, **overrides: Any) -> Preprocess:
        """The manifest's preprocessing (a bare .onnx file has none: pass the fields, and
        `patch_size` where the file was not exported by vit-deploy)."""
        patch = overrides.pop("patch_size", None)
        if patch is not None and self.patch_size and patch != self.patch_size:
            raise BundleError(f"{str(self.model_path)!r} has patch size {self.patch_size}, not "
                              f"{patch}: drop --patch / patch_size")
        if self.manifest is None:
            given = {k: v for k, v in overrides.items() if v is not None}
            patch = patch or self.patch_size
            missing = [k for k in ("resolution", "mean", "std") if k not in given]
            if missing or not patch:
                flags = {"resolution": "--res", "mean": "--mean", "std": "--std"}
                need = [f"{k} ({flags[k]})" for k in missing] + (
                    [] if patch else ["patch_size (--patch: this file does not record it)"])
                raise BundleError(
                    f"{str(self.model_path)!r} is a bare .onnx file without a manifest, so it "
                    f"does not say how to preprocess: pass {', '.join(need)}, or run a bundle "
                    f"directory")
            return Preprocess(patch_size=patch, guard=self.check_size, **given)
        return Preprocess.from_manifest(self.manifest, guard=self.check_size, **overrides)

    def _guarded(self, pre: Preprocess) -> Preprocess:
        """`pre` refusing, before it resizes anything, a size this session would refuse."""
        return pre if pre.guard is not None else dataclasses.replace(pre, guard=self.check_size)

    def check_size(self, height: int, width: int, batch: int = 1) -> None:
        """InputError unless this model takes (batch, C, height, width): a static graph's
        size, patch multiples, and (unless allow_large) the
        attention memory estimate. Preprocessing calls it before allocating the input."""
        static = self.input_shape[2:]
        if all(isinstance(d, int) for d in static) and (height, width) != tuple(static):
            raise InputError(f"this model is static at {static[0]}x{static[1]}, got "
                             f"{height}x{width}")
        if self.patch_size:
            try:
                require_patch_multiple(height, width, self.patch_size)
            except ValueError as e:
                raise InputError(str(e)) from None
        if self.config and not self.options.allow_large:
            try:
                guard_memory(height, width, self.config,
                             batch=1 if self.split_batches else batch)
            except MemoryEstimateError as e:
                raise InputError(str(e)) from None

    def validate_input(self, x: Any) -> np.ndarray:
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
        self.check_size(H, W, B)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.options.reject_nonfinite and not np.isfinite(x).all():
            raise InputError(f"input holds {int((~np.isfinite(x)).sum())} NaN/Inf values")
        return x

    # -- introspection ---------------------------------------------------------------
    @property
    def openvino(self) -> bool:
        """Whether OpenVINO runs this session (else ONNX Runtime)."""
        return is_openvino(self.providers[0])

    def placement(self) -> dict[str, list[str]]:
        """Which provider ran each node, from ONNX Runtime's own profile of one small run:
        {provider alias: [node names]}. Nodes on 'cpu' while another provider was asked
        for are the ones that fell back."""
        if self._placement is None and self.openvino:  # all on its device, or not compiled
            self._placement = {short_name(self.providers[0]): self._session.node_names()}
        if self._placement is None:
            by_name = {p.name: p.options for p in self.requested}
            static = self.input_shape[2:]  # a static graph's own size, else one patch
            P = self.patch_size or 1
            hw = tuple(static) if all(isinstance(d, int) for d in static) else (P, P)
            self._placement = profile_placement(
                self.model_path, self.session_options(),
                [(p, by_name.get(p, {})) for p in self.providers], self.input_name,
                (self.in_chans, *hw))
        return self._placement

    def session_options(self) -> ort.SessionOptions:
        return _session_options(self.options)

    def cpu_fallback_nodes(self) -> list[str]:
        if self.requested[0].name == CPU or self.openvino:
            return []
        return self.placement().get("cpu", [])

    def describe(self) -> dict[str, Any]:
        return {"model": str(self.model_path), "precision": self.precision,
                "engine": self.engine,
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


def _as_list(images: ImageInput | Sequence[ImageInput]) -> list[ImageInput]:
    """One image (path, bytes, PIL image, array) or a sequence of them -> a list."""
    if isinstance(images, (str, os.PathLike, bytes, bytearray, np.ndarray)) \
            or hasattr(images, "getpixel"):
        return [images]  # type: ignore[list-item]
    require_arg("images", images, Iterable, "an image (path, bytes, PIL image, HWC uint8 "
                "array) or a sequence of them")
    return list(images)  # type: ignore[arg-type]


def _describe(image: Any) -> str:
    if isinstance(image, (str, os.PathLike)):
        return str(image)
    if isinstance(image, np.ndarray):
        return f"<array {image.shape} {image.dtype}>"
    if isinstance(image, (bytes, bytearray)):
        return f"<{len(image)} bytes>"
    return f"<{type(image).__name__} {getattr(image, 'size', '')}>"
