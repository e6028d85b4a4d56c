"""The manifest's parts (runtime/manifest.py puts them together): files, tensors, I/O,
preprocessing, edge targets, BundleError, and the validation that reads each part from
its JSON (types and values; a listed file name must stay inside the bundle)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from vit_deploy.runtime.config import ViTConfig, check_normalization
from vit_deploy.runtime.contract import (BUCKET_POLICIES, INTERPOLATIONS, MANIFEST_NAME,
                                         MIN_CROP_PCT, PRECISIONS, RESIZE_RULES, TARGETS)
from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError
from vit_deploy.runtime.files import sha256_file
from vit_deploy.runtime.naflex.contract import (NAFLEX_INPUT_DTYPES, NAFLEX_INPUTS, NAFLEX_LAYOUT,
                                                NAFLEX_RESIZE, PATCH_BUDGET_LIMIT)
from vit_deploy.runtime.sizes import MAX_SIDE

MAX_TARGET_BATCH = 4096  # a target graph's fixed batch


class BundleError(VitDeployError, ValueError):
    """A bundle that cannot be used: says which file and why."""

    exit_code = BAD_INPUT


# -- the parts -------------------------------------------------------------------------
@dataclass(frozen=True)
class FileEntry:
    """One file of the bundle: its hash, size and what it is (`model:int8`, `weights`)."""

    sha256: str
    size: int
    role: str = ""

    @classmethod
    def of(cls, path: Path, role: str) -> FileEntry:
        return cls(sha256=sha256_file(path), size=path.stat().st_size, role=role)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]  # symbolic dims are names


@dataclass(frozen=True, kw_only=True)
class IOSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dynamic: bool
    patch_size: int
    dim_rule: str | None = None
    layer_norm: bool = True  # layer_N outputs went through the final norm (export --layers)

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    @property
    def naflex(self) -> bool:
        """SigLIP 2 NaFlex inputs (patches, mask, grids: runtime/naflex/contract.py), not an
        NCHW image."""
        return tuple(i.name for i in self.inputs) == NAFLEX_INPUTS

    def output(self, name: str) -> TensorSpec:
        for o in self.outputs:
            if o.name == name:
                return o
        raise BundleError(f"the bundle has no output {name!r}; it has {self.output_names}")


@dataclass(frozen=True, kw_only=True)
class PreprocessSpec:
    """How images become model input (runtime/preprocess.py does what this says)."""

    resolution: tuple[int, int]  # deploy (H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: str = "shorter_side_center_crop"
    interpolation: str = "bicubic"
    scale: float = 1 / 255
    color: str = "RGB"
    layout: str = "NCHW"
    # timm's crop_pct: resize to floor(side / crop_pct) first, then centre-crop the
    # resolution (shorter_side_center_crop, squash). None: resize just to cover it.
    crop_pct: float | None = None
    # resize "naflex" (layout "patches"): each image's patch budget, its aspect ratio kept
    # (runtime/naflex/preprocess.py); `resolution` is then the native size, which NaFlex does
    # not use.
    max_num_patches: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """As JSON; crop_pct and max_num_patches only when set (bundles without them read
        as before they existed)."""
        d = _plain(dataclasses.asdict(self))
        for key in ("crop_pct", "max_num_patches"):
            if d[key] is None:
                del d[key]
        return d


@dataclass(frozen=True, kw_only=True)
class BucketGraph:
    """One fixed-shape graph of an edge target: (batch, C, H, W) at one precision."""

    resolution: tuple[int, int]  # (H, W)
    batch: int
    precision: str
    file: str  # the .onnx file
    ort_file: str | None = None  # the same graph in ORT format, where the target has one
    # ((htp_arch, file), ...): the graph compiled for Qualcomm's HTP, an EPContext model a
    # phone loads without compiling (targets/htp.py --contexts)
    contexts: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {"resolution": list(self.resolution), "batch": self.batch,
               "precision": self.precision, "file": self.file, "ort_file": self.ort_file}
        return out | ({"contexts": dict(self.contexts)} if self.contexts else {})


@dataclass(frozen=True, kw_only=True)
class TargetSpec:
    """An edge target's artifacts (`vit-deploy target`): per resolution bucket a static
    graph per precision, the bucket policy the runtime follows, and what was measured
    (parity per graph, ORT's mobile checker, the ORT-format release) in `record`."""

    name: str  # one of contract.TARGETS
    batch: int  # every graph's fixed batch
    policy: str  # how the runtime picks a bucket per image (runtime/buckets.py)
    graphs: tuple[BucketGraph, ...]
    required_operators: str | None = None  # ORT's reduced-build config for the .ort files
    record: Mapping[str, Any] = field(default_factory=dict)

    @property
    def resolutions(self) -> tuple[tuple[int, int], ...]:
        return tuple(dict.fromkeys(g.resolution for g in self.graphs))

    @property
    def precisions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.precision for g in self.graphs))

    def graph(self, precision: str, hw: tuple[int, int]) -> BucketGraph | None:
        return next((g for g in self.graphs if g.precision == precision
                     and g.resolution == tuple(hw)), None)

    def files(self) -> list[str]:
        names = [n for g in self.graphs for n in (g.file, g.ort_file, *dict(g.contexts).values())
                 if n]
        return names + ([self.required_operators] if self.required_operators else [])

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "policy": self.policy,
                "graphs": [g.to_dict() for g in self.graphs],
                "required_operators": self.required_operators, "record": _plain(self.record)}


# -- validation helpers ----------------------------------------------------------------
def _need(ok: bool, where: str, field_: str, expected: str, got: Any) -> None:
    if not ok:
        raise BundleError(f"{where}: {field_} must be {expected}, got {repr(got)[:60]}")


def _is_int(v: Any, low: int = 0, high: int | None = None) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool) and v >= low
            and (high is None or v <= high))


def is_finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _files(files: dict[str, Any], where: str) -> dict[str, FileEntry]:
    out = {}
    for name, entry in files.items():
        _need(_safe_name(name), where, "files", "relative names inside the bundle", name)
        _need(isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
              and bool(re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]))
              and _is_int(entry.get("size")) and isinstance(entry.get("role", ""), str),
              where, f"files[{name!r}]", "{sha256: 64 hex chars, size: bytes, role}", entry)
        out[name] = FileEntry(entry["sha256"], entry["size"], entry.get("role", ""))
    return out


def _listed(name: Any, files: Mapping[str, Any]) -> bool:
    """`name` is a file the manifest lists (a list or object in its place is not: never a
    TypeError from the lookup)."""
    return isinstance(name, str) and name in files


def _safe_name(name: Any) -> bool:
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return False
    p = PurePosixPath(name)
    return not p.is_absolute() and ".." not in p.parts and name != MANIFEST_NAME


def _io(io: dict[str, Any], config: ViTConfig, where: str) -> IOSpec:
    _need(_is_int(io.get("patch_size"), 1) and isinstance(io.get("dynamic"), bool), where, "io",
          "an object with patch_size and dynamic", io)
    _need(io["patch_size"] == config.patch_size, where, "io.patch_size",
          f"the config's patch size {config.patch_size}", io["patch_size"])
    specs = {}
    for key in ("inputs", "outputs"):
        items = io.get(key)
        _need(isinstance(items, list) and bool(items) and all(
            isinstance(i, dict) and isinstance(i.get("name"), str)
            and isinstance(i.get("shape"), list) and all(
                _is_int(d, 1) or isinstance(d, str) for d in i["shape"]) for i in items),
            where, f"io.{key}", "a non-empty list of {name, shape, dtype}", items)
        specs[key] = tuple(TensorSpec(i["name"], str(i.get("dtype", "float32")), tuple(i["shape"]))
                           for i in items)
    shape = specs["inputs"][0].shape
    if tuple(i.name for i in specs["inputs"]) == NAFLEX_INPUTS:
        _naflex_io(specs["inputs"], config, where)
    else:
        _need(len(shape) == 4 and shape[1] == config.in_chans, where, "io.inputs[0].shape",
              f"[batch, {config.in_chans}, height, width]", list(shape))
    rule = io.get("dim_rule")
    _need(rule is None or isinstance(rule, str), where, "io.dim_rule", "a string", rule)
    names = [o.name for o in specs["outputs"]]
    _need(len(set(names)) == len(names), where, "io.outputs", "distinct output names", names)
    layer_norm = io.get("layer_norm", True)
    _need(isinstance(layer_norm, bool), where, "io.layer_norm", "true or false", layer_norm)
    return IOSpec(inputs=specs["inputs"], outputs=specs["outputs"], dynamic=io["dynamic"],
                  patch_size=io["patch_size"], dim_rule=rule, layer_norm=layer_norm)


def _naflex_io(inputs: tuple[TensorSpec, ...], config: ViTConfig, where: str) -> None:
    """A NaFlex bundle's inputs: (batch, num_patches, C*P*P) float32, (batch, num_patches)
    int32, (batch, 2) int64, the first two dims shared."""
    depth = config.in_chans * config.patch_size ** 2
    values, mask, shapes = (i.shape for i in inputs)
    _need(len(values) == 3 and values[2] == depth and len(mask) == 2
          and tuple(mask) == tuple(values[:2]) and len(shapes) == 2 and shapes[0] == values[0]
          and shapes[1] == 2 and tuple(i.dtype for i in inputs) == NAFLEX_INPUT_DTYPES,
          where, "io.inputs", f"NaFlex's [batch, num_patches, {depth}] float32, [batch, "
          f"num_patches] int32, [batch, 2] int64", [(i.shape, i.dtype) for i in inputs])


def _preprocess(pre: dict[str, Any], config: ViTConfig, io: IOSpec, where: str) -> PreprocessSpec:
    res = pre.get("resolution")
    P = config.patch_size
    _need(isinstance(res, list) and len(res) == 2 and all(_is_int(v, P, MAX_SIDE) for v in res)
          and all(v % P == 0 for v in res), where, "preprocess.resolution",
          f"[height, width], multiples of the patch size {P} up to {MAX_SIDE}", res)
    if not io.dynamic:
        _need(list(io.inputs[0].shape[2:]) == res, where, "preprocess.resolution",
              f"the static input size {list(io.inputs[0].shape[2:])}", res)
    try:  # the bounds every source of these numbers meets (config.check_normalization)
        check_normalization(pre.get("mean"), pre.get("std"), channels=config.in_chans,
                            scale=pre.get("scale"), what="preprocess.")
    except ValueError as e:
        raise BundleError(f"{where}: {e}") from None
    fields: dict[str, Any] = {"resolution": tuple(res), "mean": tuple(map(float, pre["mean"])),
                              "std": tuple(map(float, pre["std"]))}
    if io.naflex:  # the rule is NaFlex's, whatever else the file says: nothing to mix up
        budget = pre.get("max_num_patches")
        _need(pre.get("resize") == NAFLEX_RESIZE and pre.get("layout") == NAFLEX_LAYOUT
              and _is_int(budget, 1, PATCH_BUDGET_LIMIT), where, "preprocess",
              f"NaFlex's {{resize: {NAFLEX_RESIZE!r}, layout: {NAFLEX_LAYOUT!r}, "
              f"max_num_patches: 1..{PATCH_BUDGET_LIMIT}}} for NaFlex inputs",
              {k: pre.get(k) for k in ("resize", "layout", "max_num_patches")})
        return PreprocessSpec(**fields, resize=NAFLEX_RESIZE, layout=NAFLEX_LAYOUT,
                              interpolation="bilinear",
                              scale=float(pre.get("scale", 1 / 255)), max_num_patches=budget)
    _need(pre.get("max_num_patches") is None, where, "preprocess.max_num_patches",
          "absent on NCHW inputs (it is NaFlex's)", pre.get("max_num_patches"))
    for key, allowed in (("resize", RESIZE_RULES), ("interpolation", INTERPOLATIONS),
                         ("color", ("RGB",)), ("layout", ("NCHW",))):
        if key in pre:
            _need(pre[key] in allowed, where, f"preprocess.{key}", f"one of {list(allowed)}",
                  pre[key])
            fields[key] = pre[key]
    if "scale" in pre:
        _need(pre["scale"] is not None, where, "preprocess.scale", "a number", None)
        fields["scale"] = float(pre["scale"])
    crop_pct = pre.get("crop_pct")
    if crop_pct is not None:
        _need(is_finite_number(crop_pct) and MIN_CROP_PCT <= crop_pct <= 1, where,
              "preprocess.crop_pct", f"null or a number from {MIN_CROP_PCT} to 1", crop_pct)
        _need(fields.get("resize", PreprocessSpec.resize) != "patch_multiple", where,
              "preprocess.crop_pct", "null under the 'patch_multiple' rule (it never crops)",
              crop_pct)
        fields["crop_pct"] = float(crop_pct)
    return PreprocessSpec(**fields)


def _targets(targets: Any, files: Mapping[str, FileEntry], config: ViTConfig,
             where: str) -> dict[str, TargetSpec]:
    """The edge targets (absent before `vit-deploy target` existed: none)."""
    _need(isinstance(targets, dict), where, "targets", "an object", targets)
    P = config.patch_size
    out = {}
    for name, t in targets.items():
        at = f"targets[{str(name)[:20]!r}]"
        _need(name in TARGETS, where, "targets", f"names from {list(TARGETS)}", name)
        _need(isinstance(t, dict) and _is_int(t.get("batch"), 1, MAX_TARGET_BATCH)
              and t.get("policy") in BUCKET_POLICIES and isinstance(t.get("graphs"), list)
              and bool(t["graphs"]) and isinstance(t.get("record", {}), dict), where, at,
              f"{{batch: 1..{MAX_TARGET_BATCH}, policy: one of {list(BUCKET_POLICIES)}, "
              f"graphs: a non-empty list, record: an object}}", t)
        graphs = []
        for g in t["graphs"]:
            res = g.get("resolution") if isinstance(g, dict) else None
            _need(isinstance(res, list) and len(res) == 2
                  and all(_is_int(v, P, MAX_SIDE) and v % P == 0 for v in res)
                  and g.get("precision") in PRECISIONS and g.get("batch") == t["batch"]
                  and _listed(g.get("file"), files)
                  and (g.get("ort_file") is None or _listed(g.get("ort_file"), files))
                  and isinstance(g.get("contexts", {}), dict)
                  and all(isinstance(a, str) and a.isdigit() and len(a) <= 4
                          and _listed(f, files) for a, f in g.get("contexts", {}).items()),
                  where, f"{at}.graphs", f"[{{resolution: [H, W] multiples of {P} up to "
                  f"{MAX_SIDE}, batch: {t['batch']}, precision: one of {list(PRECISIONS)}, "
                  f"file and ort_file: files listed under files, contexts: {{htp_arch: a file "
                  f"listed under files}}}}]", g)
            graphs.append(BucketGraph(resolution=tuple(res), batch=g["batch"],
                                      precision=g["precision"], file=g["file"],
                                      ort_file=g.get("ort_file"),
                                      contexts=tuple(sorted(g.get("contexts", {}).items()))))
        keys = [(g.precision, g.resolution) for g in graphs]
        _need(len(set(keys)) == len(keys), where, f"{at}.graphs",
              "one graph per precision and resolution", t["graphs"])
        ops = t.get("required_operators")
        _need(ops is None or _listed(ops, files), where, f"{at}.required_operators",
              "null or a file listed under files", ops)
        out[name] = TargetSpec(name=name, batch=t["batch"], policy=t["policy"],
                               graphs=tuple(graphs), required_operators=ops,
                               record=t.get("record", {}))
    return out


def _plain(value: Any) -> Any:
    """Tuples and mappings as JSON lists and objects."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
