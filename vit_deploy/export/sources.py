"""What comes with a checkpoint besides its weights: preprocessing and class names.

`open_checkpoint` takes what `export --checkpoint` was given (a path, or a hub name that
hub.py resolves) and reads, from the files beside the weights:
- Hugging Face: `preprocessor_config.json` (do_resize + size {shortest_edge} or {height,
  width}, do_center_crop + crop_size, do_rescale + rescale_factor, do_normalize +
  image_mean / image_std, resample as a PIL filter id) and config.json's `id2label`
  (ignored when it holds only the default LABEL_0, LABEL_1, ... names);
- timm: config.json's `pretrained_cfg` (mean, std, crop_pct, crop_mode, interpolation,
  input_size) and `label_names`.

The preprocessing becomes the manifest's (runtime/preprocess.py's rules, which reproduce
the source's: see docs/checkpoints.md for what is equal and what is not).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_deploy.data import IMAGENET_CLASSES, imagenet_labels
from vit_deploy.export.checkpoints import CheckpointError, _read_json
from vit_deploy.export.checkpoints.files import optional_file
from vit_deploy.export.checkpoints.defaults import (INT_SIZE_IS_SHORTEST_EDGE, processor_class,
                                                  processor_with_defaults)
from vit_deploy.runtime.config import check_normalization
from vit_deploy.runtime.contract import INTERPOLATIONS, MIN_CROP_PCT
from vit_deploy.runtime.manifest_parts import PreprocessSpec

PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL.Image.Resampling
_PIL_UNSUPPORTED = {4: "BOX", 5: "HAMMING"}
_DEFAULT_LABEL = "LABEL_"
TIMM_CROP_MODES = {"center": "shorter_side_center_crop", "squash": "squash"}


@dataclass(frozen=True, kw_only=True)
class SourcePreprocess:
    """A checkpoint's own preprocessing, resolution-free (the crop_pct scales to any size)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: str = "shorter_side_center_crop"
    interpolation: str = "bicubic"
    scale: float = 1 / 255
    crop_pct: float | None = None
    size: tuple[int, int] | None = None  # the model input (H, W) the source's processor gives
    origin: str = ""  # the file it was read from
    # A NaFlex processor's (SigLIP 2 NaFlex): each image's patch budget and patch size, its
    # own aspect ratio kept; such a processor has no fixed size
    max_num_patches: int | None = None
    patch_size: int | None = None

    def spec(self, resolution: tuple[int, int]) -> PreprocessSpec:
        return PreprocessSpec(resolution=tuple(resolution), mean=self.mean, std=self.std,
                              resize=self.resize, interpolation=self.interpolation,
                              scale=self.scale, crop_pct=self.crop_pct)


@dataclass(frozen=True, kw_only=True)
class CheckpointSource:
    """A checkpoint ready to load, and what came with it."""

    path: Path  # the file or directory load_any reads
    source: str  # the format to load it as (auto, hf, timm, vit-deploy)
    preprocess: SourcePreprocess | None = None
    labels: tuple[str, ...] | None = None
    labels_from: str = ""
    record: dict[str, Any] = field(default_factory=dict)  # the manifest's export record
    notes: tuple[str, ...] = ()

    def labels_for(self, classes: int) -> tuple[str, ...] | None:
        """The class names when they are one per class of the loaded head; a 1000-class
        head whose checkpoint carries none gets ImageNet-1k's (shipped in the package)."""
        return self._labels(classes)[0]

    def _labels(self, classes: int) -> tuple[tuple[str, ...] | None, str]:
        if self.labels is not None:
            return (self.labels, self.labels_from) if len(self.labels) == classes else (None, "")
        if classes == IMAGENET_CLASSES:
            return imagenet_labels()
        return None, ""

    def manifest_record(self, classes: int) -> dict[str, Any]:
        notes = list(self.notes)
        if self.labels is not None and len(self.labels) != classes:
            notes.append(f"{len(self.labels)} class names in {self.labels_from} for a head of "
                         f"{classes} classes: not used")
        record = dict(self.record)
        if self.preprocess is not None:
            record["preprocess_from"] = self.within(self.preprocess.origin)
        labels, origin = self._labels(classes)
        if labels is not None:
            record["labels_from"] = self.within(origin)
        return record | ({"notes": [*record.get("notes", []), *notes]} if notes else {})

    @property
    def name(self) -> str:
        """What the manifest calls the checkpoint: its hub name, else its file or folder's
        name (a bundle is published: the local path it was exported from stays here)."""
        return str(self.record.get("checkpoint") or self.path.name)

    def within(self, origin: str) -> str:
        """`origin` (a file beside the weights, maybe with a note) relative to the
        checkpoint's folder: a manifest names no local path."""
        folder = self.path if self.path.is_dir() else self.path.parent
        for prefix in dict.fromkeys((str(folder.resolve()), str(folder))):
            if prefix not in (".", "") and origin.startswith(prefix.rstrip("/") + "/"):
                return origin[len(prefix.rstrip("/")) + 1:]
        return origin

    def export_options(self, model: Any, options: Any) -> Any:
        """`options` (bundle.ExportOptions) with what came with the checkpoint: its
        preprocessing (and its size as the deploy resolution when none was asked for and
        it is a patch multiple), its class names unless some were given, its origin. The
        model's config takes the source's mean and std."""
        pre, P = self.preprocess, model.cfg.patch_size
        resolution = options.resolution
        if pre is not None:
            model.cfg = model.cfg.replace(mean=pre.mean, std=pre.std)
            if resolution is None and pre.size and all(v % P == 0 for v in pre.size):
                resolution = pre.size
        classes = model.cfg.num_classes
        return dataclasses.replace(options, resolution=resolution, preprocess=pre,
                                   source=self.manifest_record(classes),
                                   labels=options.labels or self.labels_for(classes))


def open_checkpoint(checkpoint: str | Path, *, source: str = "auto") -> CheckpointSource:
    """A path or hub name -> the local checkpoint and its preprocessing and labels."""
    from vit_deploy.export.hub import parse_hub_name, resolve_hub

    name = parse_hub_name(str(checkpoint)) if isinstance(checkpoint, str) else None
    record: dict[str, Any] = {}
    if name is not None:
        if source not in ("auto", name.kind):
            raise CheckpointError(f"--from {source} contradicts the checkpoint {checkpoint!r}, "
                                  f"which is a {name.kind} checkpoint; drop --from")
        hub = resolve_hub(name)
        path, source, record = hub.path, name.kind, {"hub": hub.record()}
    else:
        path = Path(checkpoint)
    meta = _read_metadata(path, source)
    return CheckpointSource(path=path, source=source, record=record, **meta)


def _read_metadata(path: Path, source: str) -> dict[str, Any]:
    if path.is_dir() and source in ("auto", "hf") and (path / "config.json").is_file():
        config = _read_json(path / "config.json")
        pre = path / "preprocessor_config.json"
        labels = hf_labels(config, path / "config.json")
        preprocess = hf_preprocess(_read_json(pre), pre, config.get("model_type")) \
            if optional_file(pre, "the checkpoint's preprocessing") else None
        return {"preprocess": preprocess,
                "labels": labels, "labels_from": f"{path / 'config.json'} (id2label)"}
    beside = path.parent / "config.json"
    if path.is_file() and source in ("auto", "timm") and optional_file(
            beside, "the config beside the checkpoint"):
        config = _read_json(beside)
        if isinstance(config.get("pretrained_cfg"), dict):  # timm's config.json
            return {"preprocess": timm_preprocess(config["pretrained_cfg"], beside),
                    "labels": timm_labels(config, beside),
                    "labels_from": f"{beside} (label_names)"}
    return {}


# -- Hugging Face ---------------------------------------------------------------------------
def hf_labels(config: dict[str, Any], where: Path) -> tuple[str, ...] | None:
    """config.json's id2label as a list, or None (absent, or only LABEL_N defaults)."""
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        return None
    try:
        ids = sorted((int(k), v) for k, v in id2label.items())
    except (TypeError, ValueError):
        raise CheckpointError(f"{str(where)!r}: id2label keys must be class indices, got "
                              f"{sorted(id2label)[:5]}") from None
    if [i for i, _ in ids] != list(range(len(ids))) or not all(isinstance(v, str) for _, v in ids):
        raise CheckpointError(f"{str(where)!r}: id2label must map 0..{len(ids) - 1} to names, "
                              f"got {str(id2label)[:80]}")
    names = tuple(v for _, v in ids)
    if all(v == f"{_DEFAULT_LABEL}{i}" for i, v in enumerate(names)):
        return None  # transformers' placeholders, not class names
    return names


def _hw(value: Any, key: str, where: Path, *, int_is_edge: bool = False
        ) -> tuple[int, int] | int:
    """{height, width} -> (H, W); {shortest_edge} -> S; an int (older processors) -> (N, N),
    or S where the processor reads a bare size as the shortest edge (`int_is_edge`)."""
    def ok(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 16384

    if ok(value):
        return value if int_is_edge and key == "size" else (value, value)
    if isinstance(value, dict):
        if set(value) >= {"height", "width"} and ok(value["height"]) and ok(value["width"]):
            return (value["height"], value["width"])
        if key == "size" and ok(value.get("shortest_edge")) and value.get("longest_edge") is None:
            return value["shortest_edge"]
    raise CheckpointError(f"{str(where)!r}: {key} must be {{height, width}}"
                          + (" or {shortest_edge}" if key == "size" else "")
                          + f" of positive integers, got {str(value)[:80]}")


def crop_pct_for(crop: int, resize: int) -> float:
    """The crop_pct whose floor(crop / crop_pct) is `resize` exactly (crop / resize, nudged
    by ulps where the division rounds the wrong way)."""
    pct = crop / resize
    while math.floor(crop / pct) < resize:
        pct = math.nextafter(pct, 0.0)
    while math.floor(crop / pct) > resize:
        pct = math.nextafter(pct, 1.0)
    return pct


def hf_preprocess(data: dict[str, Any], where: Path, model_type: object = None
                  ) -> SourcePreprocess:
    """preprocessor_config.json -> the manifest's rule (transformers' PIL backend's steps:
    resize, centre crop, rescale, normalise); a field left out is its processor class's
    default, as transformers reads it (checkpoints.defaults; the class is the one the file
    names, else the one transformers picks for config.json's `model_type`)."""
    kind = processor_class(data, model_type)
    data = processor_with_defaults(data, model_type)

    def flag(key: str, default: bool) -> bool:
        v = data.get(key, default)
        if not isinstance(v, bool):
            raise CheckpointError(f"{str(where)!r}: {key} must be true or false, got {v!r}")
        return v

    resample = data.get("resample", 2)  # transformers' default for most processors: BILINEAR
    if resample in _PIL_UNSUPPORTED:
        raise CheckpointError(f"{str(where)!r}: resample {resample} "
                              f"({_PIL_UNSUPPORTED[resample]}) is not a filter the runtimes "
                              f"implement; supported: {PIL_FILTERS}")
    if resample not in PIL_FILTERS or isinstance(resample, bool):
        raise CheckpointError(f"{str(where)!r}: resample must be a PIL filter id "
                              f"{sorted(PIL_FILTERS)}, got {resample!r}")
    scale = data.get("rescale_factor", 1 / 255) if flag("do_rescale", True) else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise CheckpointError(f"{str(where)!r}: rescale_factor must be a number, got {scale!r}")
    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if flag("do_normalize", True):
        mean, std = (_channels(data.get("image_mean"), "image_mean", where),
                     _channels(data.get("image_std"), "image_std", where))
    try:
        check_normalization(mean, std, channels=3, scale=float(scale), what="image_")
    except ValueError as e:
        raise CheckpointError(f"{str(where)!r}: {e}") from None
    fields: dict[str, Any] = {"mean": mean, "std": std, "scale": float(scale),
                              "interpolation": PIL_FILTERS[resample], "origin": str(where)}
    if not flag("do_resize", True):
        raise CheckpointError(f"{str(where)!r}: do_resize is false (the model takes images at "
                              f"their own size); the runtimes always resize: not supported")
    if "max_num_patches" in data and data.get("size") is None:
        return _naflex_processor(data, where, fields)
    size = _hw(data.get("size"), "size", where,
               int_is_edge=kind in INT_SIZE_IS_SHORTEST_EDGE)
    crop = _hw(data["crop_size"], "crop_size", where) \
        if flag("do_center_crop", "crop_size" in data) else None
    if isinstance(size, int):  # shortest edge, aspect kept
        if crop is None:
            raise CheckpointError(f"{str(where)!r}: size {{shortest_edge: {size}}} without a "
                                  f"centre crop gives every aspect its own size; the runtimes "
                                  f"need a crop (or use export --res with patch_multiple)")
        if crop[0] != crop[1] or crop[0] > size:
            raise CheckpointError(f"{str(where)!r}: crop_size {list(crop)} after shortest_edge "
                                  f"{size}: expected a square crop no larger than {size}")
        return SourcePreprocess(resize="shorter_side_center_crop",
                                crop_pct=crop_pct_for(crop[0], size), size=crop, **fields)
    if crop is None or tuple(crop) == tuple(size):  # squash to (H, W), nothing to crop
        return SourcePreprocess(resize="squash", size=size, **fields)
    pct = crop_pct_for(crop[0], size[0])
    if crop[0] > size[0] or crop[1] > size[1] or math.floor(crop[1] / pct) != size[1]:
        raise CheckpointError(f"{str(where)!r}: crop_size {list(crop)} of size {list(size)}: "
                              f"expected a crop no larger than the resize, by the same fraction "
                              f"on both sides")
    return SourcePreprocess(resize="squash", crop_pct=pct, size=crop, **fields)


def _naflex_processor(data: dict[str, Any], where: Path, fields: dict[str, Any]
                      ) -> SourcePreprocess:
    """Siglip2ImageProcessor's form, as transformers' save_pretrained writes it and the hub's
    google/siglip2-*-naflex carry it: max_num_patches and patch_size, no size (each image
    resized to the largest patch grid of its aspect ratio within the budget)."""
    def count(key: str, top: int) -> int:
        v = data.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= top:
            raise CheckpointError(f"{str(where)!r}: {key} must be an integer from 1 to {top}, "
                                  f"got {str(v)[:40]}")
        return v

    return SourcePreprocess(resize="squash", max_num_patches=count("max_num_patches", 65_536),
                            patch_size=count("patch_size", 1024), **fields)


def _channels(v: Any, key: str, where: Path) -> tuple[float, ...]:
    v = [v] * 3 if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    if not isinstance(v, list) or not all(isinstance(x, (int, float))
                                          and not isinstance(x, bool) for x in v):
        raise CheckpointError(f"{str(where)!r}: {key} must be a list of numbers, got "
                              f"{str(v)[:60]}")
    return tuple(float(x) for x in v)


# -- timm -----------------------------------------------------------------------------------
def timm_labels(config: dict[str, Any], where: Path) -> tuple[str, ...] | None:
    """timm's label_names: a list, or a {index: name} mapping (timm's save_for_hf)."""
    names = config.get("label_names")
    if names is None:
        return None
    if isinstance(names, dict):
        try:
            items = sorted((int(k), v) for k, v in names.items())
        except (TypeError, ValueError):
            items = []
        names = [v for _, v in items] if [i for i, _ in items] == list(range(len(names))) \
            else None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{str(where)!r}: label_names must be a list of names (or map "
                              f"0..N-1 to names), got {str(config.get('label_names'))[:80]}")
    return tuple(names)


def timm_preprocess(cfg: dict[str, Any], where: Path) -> SourcePreprocess:
    """timm's pretrained_cfg -> the manifest's rule, as timm's eval transform
    (transforms_imagenet_eval): resize to floor(input_size / crop_pct) (the shorter side,
    crop_mode center; both sides, squash), centre-crop input_size, ToTensor (1/255), normalise."""
    def bad(key: str, expected: str) -> CheckpointError:
        return CheckpointError(f"{str(where)!r}: pretrained_cfg.{key} must be {expected}, got "
                               f"{str(cfg.get(key))[:60]}")

    mean, std = (_channels(cfg.get("mean", [0.485, 0.456, 0.406]), "pretrained_cfg.mean", where),
                 _channels(cfg.get("std", [0.229, 0.224, 0.225]), "pretrained_cfg.std", where))
    try:
        check_normalization(mean, std, channels=3, what="pretrained_cfg.")
    except ValueError as e:
        raise CheckpointError(f"{str(where)!r}: {e}") from None
    interpolation = cfg.get("interpolation", "bicubic")
    if interpolation not in INTERPOLATIONS:
        raise bad("interpolation", f"one of {list(INTERPOLATIONS)}")
    crop_pct = cfg.get("crop_pct", 0.875)
    if isinstance(crop_pct, bool) or not isinstance(crop_pct, (int, float)) \
            or not MIN_CROP_PCT <= crop_pct <= 1:
        raise bad("crop_pct", f"a number from {MIN_CROP_PCT} to 1")
    mode = cfg.get("crop_mode", "center")
    if mode not in TIMM_CROP_MODES:
        raise bad("crop_mode", f"one of {list(TIMM_CROP_MODES)} (the runtimes do not pad: "
                               f"'border' is not supported)")
    size = cfg.get("input_size")
    if not (isinstance(size, list) and len(size) == 3 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in size)):
        raise bad("input_size", "[channels, height, width]")
    return SourcePreprocess(mean=mean, std=std, resize=TIMM_CROP_MODES[mode],
                            interpolation=interpolation, crop_pct=float(crop_pct),
                            size=(size[1], size[2]), origin=f"{where} (pretrained_cfg)")
