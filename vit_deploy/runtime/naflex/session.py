"""A SigLIP 2 NaFlex graph (export/naflex/model.py) in ONNX Runtime, torch-free: images of any
aspect ratio, one batch, each image's pooled embedding and its patch tokens on its own grid.

The graph carries what this needs in its metadata: our config (patch size, normalisation)
and the NaFlex marker (its inputs are patches + mask + grids, not an NCHW image).
Shapes in comments: B batch, N max_num_patches, D width, gh/gw an image's grid.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from vit_deploy.runtime.contract import MANIFEST_NAME, MODEL_FILE
from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError, require_arg
from vit_deploy.runtime.manifest import Manifest, load_manifest
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.model_scan import _file_contains, inspect_model
from vit_deploy.runtime.naflex.contract import (ATTENTION_MASK, METADATA_NAFLEX_KEY, NAFLEX_INPUTS,
                                                NAFLEX_OUTPUTS, PIXEL_VALUES, SPATIAL_SHAPES,
                                                MAX_NUM_PATCHES)
from vit_deploy.runtime.naflex.preprocess import NaFlexBatch, NaFlexPreprocess
from vit_deploy.runtime.ort_session import (RuntimeOptions, _config_from_metadata,
                                            _create_session)
from vit_deploy.runtime.preprocess import ImageInput
from vit_deploy.runtime.providers import ProviderSpec, is_openvino, parse_providers
from vit_deploy.runtime.session import ViTSession
from vit_deploy.runtime.swap import recover_on_open
from vit_deploy.runtime.sizes import guard_tokens


class NaFlexInputError(VitDeployError, ValueError):
    """A NaFlexBatch the graph cannot take: says which input and what was expected."""

    exit_code = BAD_INPUT


@dataclass(frozen=True)
class NaFlexFeatures:
    """What a batch of images gives: pooled (B, D), and per image its patch tokens on its
    own grid (gh, gw, D), padding dropped."""

    pooled: np.ndarray
    tokens: list[np.ndarray]


class NaFlexSession:
    """NaFlexSession(a NaFlex bundle, model.onnx, or a folder holding it): features(images)
    -> NaFlexFeatures. A context manager, like ViTSession.

    A bundle (manifest.json) is verified, its `precision` model is run and its patch budget
    and normalisation are used. `max_num_patches`: each image's patch budget
    (Siglip2ImageProcessor's rule; default the bundle's, else 256); more patches, finer
    grids, slower runs."""

    def __init__(self, model: str | Path, *,
                 provider: ProviderSpec | Sequence[ProviderSpec] = "cpu",
                 options: RuntimeOptions = RuntimeOptions(), precision: str = "fp32",
                 max_num_patches: int | None = None, target: str | None = "auto"):
        require_arg("NaFlexSession(model)", model, (str, os.PathLike), "a NaFlex bundle "
                    "directory or .onnx file path")
        if target not in ("auto", "none", None):  # ViTSession's argument, so open_session
            raise NaFlexInputError(  # passes the same ones to either kind
                f"target {target!r}: a NaFlex bundle has no bucket graphs (it takes each "
                f"image at its own aspect ratio); leave target at 'auto' or 'none'")
        require_arg("precision", precision, str, "a precision name such as 'fp32' or 'int8'")
        require_arg("options", options, RuntimeOptions, "a RuntimeOptions(...)")
        providers = parse_providers(provider)
        if any(is_openvino(p.name) for p in providers):  # ORT said "not in this build"
            asked = ", ".join(p.alias for p in providers)
            raise NaFlexInputError(
                f"provider {asked}: NaFlexSession runs through ONNX Runtime only; OpenVINO "
                f"(the openvino package) runs NCHW bundles. Use cpu, cuda or tensorrt, or "
                f"openvino-ep with an onnxruntime-openvino build")
        path = Path(model)
        recover_on_open(path)
        self.manifest: Manifest | None = None
        if (path / MANIFEST_NAME).is_file():
            self.manifest = load_manifest(path, verify=options.verify)
            if not self.manifest.naflex:
                raise BundleError(f"{str(path)!r} is a bundle of NCHW inputs, not NaFlex: "
                                  f"open it with ViTSession (or vit_deploy.runtime.open_session)")
            path = self.manifest.model_path(path, precision)
        elif precision != "fp32":
            raise BundleError(f"precision {precision!r} needs a bundle (manifest.json); "
                              f"{str(path)!r} is not one")
        path = path / MODEL_FILE if path.is_dir() else path
        if not path.is_file():
            raise BundleError(f"no NaFlex model at {str(path)!r} (expected an .onnx file or a "
                              f"folder holding {MODEL_FILE})")
        # dynamic int8 quantises activations per tensor: a batch couples its images, so
        # they run one at a time (as ViTSession does), unless options say otherwise
        coupled = inspect_model(path, set(self.manifest.files) if self.manifest else None)
        self.split_batches = (coupled if options.split_batches is None
                              else options.split_batches)
        self.session, self.fallback_reason, _ = _create_session(
            path, providers, options, fallback=False)
        self.precision, self.providers = precision, self.session.get_providers()
        self.engine = f"onnxruntime {ort.__version__}"  # as ViTSession says what ran it
        self.output_names = list(NAFLEX_OUTPUTS)
        meta = self.session.get_modelmeta().custom_metadata_map
        names = ([i.name for i in self.session.get_inputs()],
                 [o.name for o in self.session.get_outputs()])
        if METADATA_NAFLEX_KEY not in meta or names != (list(NAFLEX_INPUTS), list(NAFLEX_OUTPUTS)):
            raise BundleError(f"{str(path)!r} is not a NaFlex graph: expected inputs "
                              f"{list(NAFLEX_INPUTS)}, outputs {list(NAFLEX_OUTPUTS)} and the "
                              f"{METADATA_NAFLEX_KEY!r} metadata; got inputs {names[0]}, "
                              f"outputs {names[1]} (export it with export_naflex_onnx)")
        cfg = _config_from_metadata(self.session)
        if cfg is None:
            raise BundleError(f"{str(path)!r} carries no vit-deploy config in its metadata")
        self.config, self.path = cfg, path
        spec = self.manifest.preprocess if self.manifest else None
        budget = max_num_patches if max_num_patches is not None else (
            spec.max_num_patches if spec and spec.max_num_patches else MAX_NUM_PATCHES)
        self.preprocess = NaFlexPreprocess(
            patch_size=cfg.patch_size, max_num_patches=budget,
            mean=spec.mean if spec else cfg.mean, std=spec.std if spec else cfg.std)
        self.allow_large = options.allow_large
        # every image is resized to fill its budget: a budget whose attention cannot fit
        # is refused before any image is read (as ViTSession refuses such a size)
        self._guard(budget, 1, f"max_num_patches {budget}", "a smaller max_num_patches")

    def _guard(self, tokens: int, batch: int, what: str, advice: str) -> None:
        if not self.allow_large:
            guard_tokens(tokens, self.config, batch=batch, what=what, advice=advice,
                         override="allow_large=True")

    def __enter__(self) -> NaFlexSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the ONNX Runtime session (its memory); the object is unusable after."""
        self.session = None  # type: ignore[assignment]

    def pooled(self, images: Sequence[ImageInput]) -> np.ndarray:
        """Images -> their pooled embeddings (B, D)."""
        return self.features(images).pooled

    def _live(self) -> Any:
        if self.session is None:
            raise RuntimeError("this NaFlexSession is closed")
        return self.session

    def run(self, batch: NaFlexBatch) -> dict[str, np.ndarray]:
        """The graph on prepared inputs -> {pooled (B, D), last_hidden_state (B, N, D)}."""
        session = self._live()
        require_arg("batch", batch, NaFlexBatch, "a NaFlexBatch (session.preprocess(images))")
        self.validate(batch)
        B, N = batch.pixel_values.shape[:2]
        self._guard(N, 1 if self.split_batches else B,
                    f"{PIXEL_VALUES} {batch.pixel_values.shape}", "fewer patches per image")
        if self.split_batches and len(batch.pixel_values) > 1:
            rows = [session.run(None, NaFlexBatch(*(a[i:i + 1] for a in batch)).feeds())
                    for i in range(len(batch.pixel_values))]
            return {n: np.concatenate([r[k] for r in rows])
                    for k, n in enumerate(NAFLEX_OUTPUTS)}
        return dict(zip(NAFLEX_OUTPUTS, session.run(None, batch.feeds())))

    run_all = run  # ViTSession's name for every output by name

    def outputs(self, images: Sequence[ImageInput] | NaFlexBatch) -> dict[str, np.ndarray]:
        """Images (or their NaFlexBatch, prepared) -> every output by name, last_hidden_state's
        padding rows zeroed (they are not outputs): what check and quantize compare."""
        batch = images if isinstance(images, NaFlexBatch) else self._batch(images)
        out = self.run(batch)
        out[NAFLEX_OUTPUTS[1]] = out[NAFLEX_OUTPUTS[1]] * batch.pixel_attention_mask[..., None]
        return out

    def _batch(self, images: Sequence[ImageInput]) -> NaFlexBatch:
        """One image or a list of them, checked at the door (a closed session, a wrong
        type), preprocessed into one batch."""
        self._live()
        if isinstance(images, (str, os.PathLike, bytes, bytearray, np.ndarray)) \
                or hasattr(images, "getpixel"):
            images = [images]  # one image, as ViTSession takes it
        require_arg("images", images, (list, tuple), "an image (path, bytes, PIL image, HWC "
                    "uint8 array) or a list of them")
        return self.preprocess(images)

    def features(self, images: Sequence[ImageInput]) -> NaFlexFeatures:
        """Images (paths, bytes, PIL images or HWC uint8 arrays, any sizes) -> features."""
        batch = self._batch(images)
        out = self.run(batch)
        tokens = [last[:gh * gw].reshape(gh, gw, -1) for last, (gh, gw)
                  in zip(out[NAFLEX_OUTPUTS[1]], batch.spatial_shapes.tolist())]
        return NaFlexFeatures(out[NAFLEX_OUTPUTS[0]], tokens)

    def validate(self, batch: NaFlexBatch) -> None:
        """Shapes, dtypes and grids against the graph: NaFlexInputError naming the input."""
        values, mask, shapes = batch
        P, C = self.config.patch_size, self.config.in_chans
        expected = {PIXEL_VALUES: (values, 3, np.float32, P * P * C),
                    ATTENTION_MASK: (mask, 2, np.int32, None),
                    SPATIAL_SHAPES: (shapes, 2, np.int64, 2)}
        for name, (a, ndim, dtype, last) in expected.items():
            if not isinstance(a, np.ndarray) or a.ndim != ndim or a.dtype != dtype or (
                    last is not None and a.shape[-1] != last):
                got = (f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__)
                raise NaFlexInputError(f"{name}: expected a {ndim}-D {np.dtype(dtype)} array"
                                       f"{f' ending in {last}' if last else ''}, got {got}")
        B, N = values.shape[:2]
        if mask.shape != (B, N) or shapes.shape[0] != B:
            raise NaFlexInputError(f"expected {ATTENTION_MASK} ({B}, {N}) and {SPATIAL_SHAPES} "
                                   f"({B}, 2) for {PIXEL_VALUES} {values.shape}, got "
                                   f"{mask.shape} and {shapes.shape}")
        cells = shapes.prod(axis=1)
        if B == 0 or (shapes < 1).any() or (cells > N).any() or (mask.sum(1) != cells).any():
            raise NaFlexInputError(f"every image needs a grid of 1..{N} patches and that many "
                                   f"real patches in its mask; got grids {shapes.tolist()}, "
                                   f"real patches {mask.sum(1).tolist()}")
        # the real patches come first, in grid order, the padding after them: the model reads
        # patch i as grid cell i (a mask of 1s elsewhere pooled the padding: off by 3.6)
        bad = np.flatnonzero((mask != (np.arange(N)[None, :] < cells[:, None])).any(axis=1))
        if bad.size:
            i = int(bad[0])
            raise NaFlexInputError(f"{ATTENTION_MASK}: each row must be its image's grid of 1s "
                                   f"first, then 0s (padding); image {i} is not "
                                   f"({int(cells[i])} cells, mask {mask[i, :12].tolist()}"
                                   f"{' ...' if N > 12 else ''})")


def open_session(model: str | Path, **kwargs: Any) -> ViTSession | NaFlexSession:
    """The session `model` (a bundle, or a .onnx file) needs: NaFlexSession for a NaFlex
    one, else ViTSession; `kwargs` go to it (both take provider, options, precision and
    target, which a NaFlex bundle takes as 'auto' or 'none' only; NaFlexSession also
    max_num_patches)."""
    path = Path(model)
    if (path / MANIFEST_NAME).is_file():
        naflex = load_manifest(path, verify=False).naflex  # the session verifies it
    else:
        naflex = path.is_file() and bool(_file_contains(path, (METADATA_NAFLEX_KEY.encode(),)))
    return NaFlexSession(path, **kwargs) if naflex else ViTSession(path, **kwargs)
