"""The bundle manifest as one typed, validated value (torch-free).

Written by the exporter and by every command that adds to a bundle, read by everything
else through its fields and methods. `Manifest.from_dict` validates types *and* values
(mean, std and scale within config.check_normalization's bounds, sane resolutions,
labels matching the classes, file names that stay inside the bundle, bounded nesting;
`bundle_path` is the one way from a listed name to a file) and reads every format
version up to ours: v1 (before the typed manifest) left some preprocessing fields and file
roles implicit; they are filled with what v1 always meant.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.contract import (BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, MANIFEST_NAME,
                                         WEIGHTS_FILE, WEIGHTS_ROLE, model_role)
from vit_deploy.runtime.purpose import Purpose, parse_purpose
from vit_deploy.runtime.recipe import Int8Recipe
from vit_deploy.runtime.errors import require_arg
from vit_deploy.runtime.files import sha256_file, write_bytes_atomic
from vit_deploy.runtime.manifest_parts import (BundleError, FileEntry, IOSpec, PreprocessSpec,
                                               TargetSpec, _files, _io, _is_int, _need, _plain,
                                               _preprocess, _safe_name, _targets)
from vit_deploy.runtime.naflex.references import NaFlexReferences, parse_naflex_references
from vit_deploy.runtime.references import References, parse_references
from vit_deploy.runtime.sizes import format_resolution, require_patch_multiple
from vit_deploy.runtime.swap import recover_on_open

MAX_MANIFEST_BYTES = 16 * 2**20  # ours are ~10 KB; a manifest is read whole before parsing
MAX_DEPTH = 16  # nesting of the JSON; ours is 6 deep
_PRECISION_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    config: ViTConfig
    preprocess: PreprocessSpec
    io: IOSpec
    models: Mapping[str, str]  # precision -> file
    files: Mapping[str, FileEntry]  # every file the bundle owns
    labels: tuple[str, ...] | None = None
    created: str = ""
    # Records: what the export and each precision measured (free-form JSON objects that
    # the tools write and display; the runtime decides nothing from them but `recipe.kind`).
    export: Mapping[str, Any] = field(default_factory=dict)
    parity: Mapping[str, Any] = field(default_factory=dict)
    precisions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    targets: Mapping[str, TargetSpec] = field(default_factory=dict)  # edge targets by name
    references: References | None = None  # golden outputs (runtime/references.py); old: none
    # a NaFlex bundle's golden outputs (runtime/naflex/references.py)
    naflex_references: NaFlexReferences | None = None
    format_version: int = BUNDLE_FORMAT_VERSION
    # what the bundle is for (runtime/purpose.py); left out: read from the outputs
    purpose: Purpose | None = None

    def __post_init__(self) -> None:
        if self.purpose is None:
            object.__setattr__(self, "purpose", Purpose.of_outputs(self.io.outputs))

    # -- the questions callers ask -----------------------------------------------------
    @property
    def deploy_resolution(self) -> tuple[int, int]:
        return self.preprocess.resolution

    @property
    def naflex(self) -> bool:
        """SigLIP 2 NaFlex inputs (patches, mask, grids), not NCHW: NaFlexSession runs it."""
        return self.io.naflex

    def require_nchw(self, what: str) -> None:
        """BundleError naming `what` (a command) for a NaFlex bundle, which it cannot use."""
        if self.naflex:
            raise BundleError(f"{what} needs a bundle that takes NCHW images; this one is a "
                              f"SigLIP 2 NaFlex bundle (patches + mask + grids, each image "
                              f"at its own aspect ratio): use predict, check, info or "
                              f"vit_deploy.runtime.NaFlexSession")

    @property
    def native_resolution(self) -> tuple[int, int]:
        """The position table's grid × patch; a static bundle's only size is its deploy one."""
        return self.config.img_size if self.io.dynamic else self.deploy_resolution

    @property
    def weights_file(self) -> str | None:
        """The PyTorch weights the bundle was exported from (for `check`), if it has them."""
        return next((n for n, e in self.files.items() if e.role == WEIGHTS_ROLE), None)

    def model_file(self, precision: str) -> str:
        if precision not in self.models:
            raise BundleError(f"bundle has no {precision!r} model; it has {sorted(self.models)}"
                              + ("" if precision == "fp32" else
                                 f" (add it with vit-deploy quantize --precision {precision})"))
        return self.models[precision]

    def require_models(self, precisions: Iterable[str]) -> None:
        for precision in precisions:
            self.model_file(precision)

    def resolve(self, root: str | Path, name: str) -> Path:
        """The path of a file this manifest lists (see `bundle_path`); a name it does not
        list is refused too, so every file opened is one the manifest hashes."""
        if name not in self.files:
            raise BundleError(f"{name!r} is not a file of this bundle (the manifest lists "
                              f"{sorted(self.files)[:8]})")
        return bundle_path(root, name)

    def model_path(self, root: str | Path, precision: str) -> Path:
        return self.resolve(root, self.model_file(precision))

    def allows(self, hw: tuple[int, int]) -> bool:
        try:
            self.require_size(hw)
        except ValueError:
            return False
        return True

    def require_size(self, hw: tuple[int, int]) -> None:
        """ValueError unless the bundle's graphs take `hw` (static bundles: one size)."""
        if not self.io.dynamic and tuple(hw) != self.deploy_resolution:
            raise ValueError(f"this bundle is static at {format_resolution(self.deploy_resolution)}"
                             f", cannot run {format_resolution(tuple(hw))}")
        require_patch_multiple(*hw, self.io.patch_size)

    def recipe(self, precision: str) -> Mapping[str, Any]:
        record = self.precisions.get(precision, {})
        recipe = record.get("recipe") if isinstance(record, Mapping) else None
        return recipe if isinstance(recipe, Mapping) else {}

    def batch_coupled(self, precision: str) -> bool:
        """Whether the precision quantises activations per batch (dynamic int8)."""
        return self.recipe(precision).get("kind") == "dynamic"

    def int8_recipe(self, precision: str) -> Int8Recipe | None:
        """The typed int8 recipe of `precision` (runtime/recipe.py); None if not int8."""
        return Int8Recipe.read(self.recipe(precision))

    def int8_cpu(self, precision: str) -> str | None:
        """The CPUs the precision's int8 file is exact on (runtime/cpu.py): 'any', 'vnni',
        or None for a precision that is not int8 (`Int8Recipe.needs`)."""
        recipe = self.int8_recipe(precision)
        return recipe.needs if recipe else None

    def owned_files(self) -> list[str]:
        """Every file the bundle wrote: the listed ones and the manifest itself."""
        return [*self.files, MANIFEST_NAME]

    def target(self, name: str) -> TargetSpec:
        if name not in self.targets:
            raise BundleError(f"bundle has no {name!r} target; it has {sorted(self.targets) or 'none'}"
                              f" (add it with vit-deploy target BUNDLE --target {name} --buckets ...)")
        return self.targets[name]

    # -- changes -----------------------------------------------------------------------
    def with_references(self, refs: References, entry: FileEntry) -> Manifest:
        """This manifest with `refs` (their file's `entry`) in place of any earlier ones."""
        files = {n: e for n, e in self.files.items()
                 if self.references is None or n != self.references.file}
        return dataclasses.replace(self, files={**files, refs.file: entry}, references=refs,
                                   format_version=BUNDLE_FORMAT_VERSION)

    def with_target(self, spec: TargetSpec, entries: Mapping[str, FileEntry]) -> Manifest:
        """This manifest with `spec` in place of any target of its name: the old target's
        files leave `files`, the new ones (`entries`, one per file of `spec`) come in."""
        missing = sorted(set(spec.files()) - set(entries))
        if missing:
            raise ValueError(f"target {spec.name!r} lists files without entries: {missing}")
        old = set(self.targets[spec.name].files()) if spec.name in self.targets else set()
        files = {n: e for n, e in self.files.items() if n not in old}
        return dataclasses.replace(self, files={**files, **entries},
                                   targets={**self.targets, spec.name: spec},
                                   format_version=BUNDLE_FORMAT_VERSION)

    def with_precision(self, precision: str, file: str, entry: FileEntry,
                       record: Mapping[str, Any]) -> Manifest:
        return dataclasses.replace(
            self, models={**self.models, precision: file}, files={**self.files, file: entry},
            precisions={**self.precisions, precision: dict(record)},
            format_version=BUNDLE_FORMAT_VERSION)

    # -- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": BUNDLE_FORMAT,
            "format_version": self.format_version,
            "created": self.created,
            "config": self.config.to_dict(),
            "preprocess": self.preprocess.to_dict(),
            "io": _plain(dataclasses.asdict(self.io)),
            "labels": list(self.labels) if self.labels is not None else None,
            "purpose": self.purpose.to_dict() if self.purpose else None,
            "models": dict(self.models),
            "files": {n: dataclasses.asdict(e) for n, e in self.files.items()},
            "export": _plain(self.export),
            "parity": _plain(self.parity),
            "precisions": _plain(self.precisions),
            "versions": dict(self.versions),
            **({"targets": {n: t.to_dict() for n, t in self.targets.items()}}
               if self.targets else {}),
            **({"references": self.references.to_dict()} if self.references else {}),
            **({"naflex_references": self.naflex_references.to_dict()}
               if self.naflex_references else {}),
        }

    def to_json(self) -> str:
        return dumps_strict(self.to_dict()) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "manifest") -> Manifest:
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise BundleError(f"{where}: JSON nested too deeply") from None
        except (json.JSONDecodeError, ValueError) as e:
            raise BundleError(f"{where} is not valid JSON: {e}") from None
        return cls.from_dict(data, where)

    @classmethod
    def from_dict(cls, m: Any, where: str = "manifest") -> Manifest:
        if not isinstance(m, dict):
            raise BundleError(f"{where} must hold a JSON object, got {type(m).__name__}")
        if _depth(m) > MAX_DEPTH:
            raise BundleError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
        missing = [k for k in ("format", "format_version", "config", "preprocess", "io",
                               "files", "models") if k not in m]
        if missing:
            raise BundleError(f"{where} misses keys {missing}")
        version = m["format_version"]
        if (m["format"] != BUNDLE_FORMAT or not _is_int(version, 1)
                or version > BUNDLE_FORMAT_VERSION):
            raise BundleError(f"{where} has format {str(m['format'])[:40]!r} v{str(version)[:10]}; "
                              f"this version reads {BUNDLE_FORMAT!r} up to v{BUNDLE_FORMAT_VERSION}")
        for key in ("config", "preprocess", "io", "files", "models"):
            _need(isinstance(m[key], dict), where, key, "an object", m[key])
        for key in ("export", "parity", "precisions", "versions"):
            _need(isinstance(m.get(key, {}), dict), where, key, "an object", m.get(key))
        try:
            config = ViTConfig.from_dict(m["config"])
        except (TypeError, ValueError) as e:
            raise BundleError(f"{where}: config.{e}") from None
        files = _files(m["files"], where)
        io = _io(m["io"], config, where)
        preprocess = _preprocess(m["preprocess"], config, io, where)
        models = m["models"]
        for precision, name in models.items():
            _need(isinstance(precision, str) and bool(_PRECISION_NAME.match(precision)), where,
                  "models", "precision names like int8-static", precision)
            _need(isinstance(name, str) and name in files, where, f"models[{precision!r}]",
                  "a file listed under files", name)
        if version == 1:  # v1 could leave roles out: what each listed name always meant
            implied = {name: model_role(p) for p, name in models.items()} | {
                WEIGHTS_FILE: WEIGHTS_ROLE}
            files = {name: e if e.role or name not in implied
                     else dataclasses.replace(e, role=implied[name]) for name, e in files.items()}
        _need("fp32" in models, where, "models", "an object with an fp32 model", models)
        labels = m.get("labels")
        classes = config.num_classes or None
        _need(labels is None or (isinstance(labels, list) and len(labels) == classes and all(
            isinstance(x, str) and len(x) <= 1000 for x in labels)), where, "labels",
            f"null or {classes} strings (one per output of the model)" if classes else
            "null (the model has no classifier)", labels)
        for precision, record in m.get("precisions", {}).items():
            _need(isinstance(record, dict), where, f"precisions[{precision!r}]", "an object",
                  record)
        _need(all(isinstance(v, str) for v in m.get("versions", {}).values()), where,
              "versions", "an object of strings", m.get("versions"))
        created = m.get("created", "")
        _need(isinstance(created, str), where, "created", "a string", created)
        return cls(config=config, preprocess=preprocess, io=io, models=dict(models),
                   files=files, labels=tuple(labels) if labels is not None else None,
                   created=created, export=m.get("export", {}), parity=m.get("parity", {}),
                   precisions=m.get("precisions", {}), versions=m.get("versions", {}),
                   targets=_targets(m.get("targets", {}), files, config, where),
                   references=parse_references(m.get("references"), files, io, config, where),
                   naflex_references=parse_naflex_references(m.get("naflex_references"), files,
                                                             io, where),
                   format_version=version,
                   purpose=parse_purpose(m.get("purpose"), io.outputs, where))

    # -- files -------------------------------------------------------------------------
    def verify_files(self, root: str | Path) -> None:
        """Every listed file is inside the bundle, present, of its size and sha256."""
        root = Path(root)
        for name, entry in self.files.items():
            path = self.resolve(root, name)
            if not path.is_file():
                raise BundleError(f"bundle file {name!r} is missing from {str(root)!r}")
            size = path.stat().st_size
            if size != entry.size:
                raise BundleError(f"bundle file {name!r} has {size} bytes, the manifest says "
                                  f"{entry.size} (truncated or replaced)")
            digest = sha256_file(path)
            if digest != entry.sha256:
                raise BundleError(f"bundle file {name!r} has sha256 {digest[:16]}…, the manifest "
                                  f"says {entry.sha256[:16]}… (modified after export)")

    def save(self, root: str | Path) -> Path:
        return write_bytes_atomic(Path(root) / MANIFEST_NAME, self.to_json().encode())


def load_manifest(bundle: str | Path, *, verify: bool = True) -> Manifest:
    """Read `bundle/manifest.json`; with `verify`, check every listed file's size and sha256."""
    require_arg("load_manifest(bundle)", bundle, (str, os.PathLike), "a bundle directory path")
    require_arg("verify", verify, bool, "True or False")
    recover_on_open(bundle)  # a writer killed mid-swap: finish or undo it, drop its staging
    root = Path(bundle)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        raise BundleError(f"bundle {str(root)!r} is not a directory")
    if not path.is_file():
        raise BundleError(f"{str(path)!r} is missing: {str(root)!r} is not a vit-deploy bundle")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{str(path)!r} has {path.stat().st_size} bytes, over the "
                          f"{MAX_MANIFEST_BYTES}-byte limit for a manifest")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BundleError(f"{str(path)!r} is not valid JSON: {e}") from None
    manifest = Manifest.from_json(text, repr(str(path)))
    if verify:
        manifest.verify_files(root)
    return manifest


def bundle_path(root: str | Path, name: str) -> Path:
    """The one way from a file name a manifest gives to a path, whatever `verify` says:
    `root/name` resolved, refused (BundleError) when the name is absolute, holds `..`, a
    backslash or NUL, or resolves (through symlinks, at any depth) outside `root`. Links
    that stay inside the bundle are followed."""
    if not _safe_name(name):
        raise BundleError(f"manifest names file {str(name)[:80]!r}: expected a relative path "
                          f"inside the bundle (no absolute path, no '..')")
    base = Path(root).resolve()
    path = (base / name).resolve()
    if base not in path.parents:
        raise BundleError(f"manifest names file {name!r}, which resolves to {str(path)!r}, "
                          f"outside the bundle {str(base)!r} (a symlink leaving it?); refused")
    return path


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _depth(value: Any, level: int = 1) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level)
    return level


def dumps_strict(value: Any, indent: int | None = 2) -> str:
    """JSON that every parser reads: NaN and ±Inf (a failed comparison's cosine, say) are
    written as null, never as the bare NaN that Python's json writes by default."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
