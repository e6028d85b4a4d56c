"""Reading and verifying a bundle's manifest (torch-free)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from vit_deploy.contract import BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, MANIFEST_NAME

REQUIRED_KEYS = ("format", "format_version", "config", "preprocess", "io", "files", "models")


class BundleError(ValueError):
    """A bundle that cannot be used: says which file and why."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "size": path.stat().st_size}


def load_manifest(bundle: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """Parse `bundle/manifest.json`; with `verify`, check every listed file's size and sha256."""
    root = Path(bundle)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        raise BundleError(f"bundle {str(root)!r} is not a directory")
    if not path.is_file():
        raise BundleError(f"{str(path)!r} is missing: {str(root)!r} is not a vit-deploy bundle")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"{str(path)!r} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{str(path)!r} must hold a JSON object, got {type(manifest).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise BundleError(f"{str(path)!r} misses keys {missing}")
    version = manifest["format_version"]
    if (manifest["format"] != BUNDLE_FORMAT or not isinstance(version, int)
            or isinstance(version, bool) or version > BUNDLE_FORMAT_VERSION):
        raise BundleError(
            f"{str(path)!r} has format {manifest['format']!r} v{version!r}; "
            f"this version reads {BUNDLE_FORMAT!r} up to v{BUNDLE_FORMAT_VERSION}")
    validate(manifest, str(path))
    if verify:
        verify_files(root, manifest)
    return manifest


def _fail(where: str, field: str, expected: str, got: Any) -> BundleError:
    shown = repr(got)
    return BundleError(f"{where}: {field} must be {expected}, got {shown[:60]}")


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def validate(m: dict[str, Any], where: str = "manifest") -> None:
    """Check the structure the runtime relies on; a BundleError names the bad field."""
    for key, kind in (("config", dict), ("preprocess", dict), ("io", dict), ("files", dict),
                      ("models", dict)):
        if not isinstance(m[key], kind):
            raise _fail(where, key, "an object", m[key])
    cfg, pre, io, files = m["config"], m["preprocess"], m["io"], m["files"]
    for key in ("patch_size", "in_chans", "heads", "width"):
        if not _is_int(cfg.get(key), 1):
            raise _fail(where, f"config.{key}", "a positive integer", cfg.get(key))
    if not _is_int(cfg.get("num_classes"), 0):
        raise _fail(where, "config.num_classes", "an integer >= 0", cfg.get("num_classes"))
    res = pre.get("resolution")
    if not (isinstance(res, list) and len(res) == 2 and all(_is_int(v, 1) for v in res)):
        raise _fail(where, "preprocess.resolution", "[height, width] positive integers", res)
    for key in ("mean", "std"):
        v = pre.get(key)
        if not (isinstance(v, list) and len(v) == cfg["in_chans"]
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise _fail(where, f"preprocess.{key}", f"{cfg['in_chans']} numbers", v)
    if not all(isinstance(x, (int, float)) and x > 0 for x in pre["std"]):
        raise _fail(where, "preprocess.std", "positive numbers", pre["std"])
    if not _is_int(io.get("patch_size"), 1) or not isinstance(io.get("dynamic"), bool):
        raise _fail(where, "io", "an object with patch_size and dynamic", io)
    for key in ("inputs", "outputs"):
        items = io.get(key)
        if not (isinstance(items, list) and items and all(
                isinstance(i, dict) and isinstance(i.get("name"), str)
                and isinstance(i.get("shape"), list) for i in items)):
            raise _fail(where, f"io.{key}", "a non-empty list of {name, shape, dtype}", items)
    for key in ("export", "parity", "precisions", "versions"):
        if key in m and not isinstance(m[key], dict):
            raise _fail(where, key, "an object", m[key])
    for key in ("resize", "interpolation"):
        if key in pre and not isinstance(pre[key], str):
            raise _fail(where, f"preprocess.{key}", "a string", pre[key])
    if not isinstance(cfg.get("img_size"), list) or len(cfg["img_size"]) != 2 or not all(
            _is_int(v, 1) for v in cfg["img_size"]):
        raise _fail(where, "config.img_size", "[height, width] positive integers",
                    cfg.get("img_size"))
    for name, entry in files.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
                and len(entry["sha256"]) == 64 and _is_int(entry.get("size"))):
            raise _fail(where, f"files[{name!r}]", "{sha256: 64 hex chars, size: bytes}", entry)
    for precision, name in m["models"].items():
        if not isinstance(name, str) or name not in files:
            raise _fail(where, f"models[{precision!r}]", "a file listed under files", name)
    labels = m.get("labels")
    if labels is not None and not (isinstance(labels, list) and len(labels) == cfg["num_classes"]
                                   and all(isinstance(x, str) for x in labels)):
        raise _fail(where, "labels", f"null or {cfg['num_classes']} strings", labels)


def verify_files(root: Path, manifest: dict[str, Any]) -> None:
    for name, entry in manifest["files"].items():
        path = (root / name).resolve()
        if root.resolve() not in path.parents:
            raise BundleError(f"manifest lists {name!r}, which lies outside the bundle")
        if not path.is_file():
            raise BundleError(f"bundle file {name!r} is missing from {str(root)!r}")
        size = path.stat().st_size
        if size != entry["size"]:
            raise BundleError(f"bundle file {name!r} has {size} bytes, the manifest says "
                              f"{entry['size']} (truncated or replaced)")
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise BundleError(f"bundle file {name!r} has sha256 {digest[:16]}…, the manifest "
                              f"says {entry['sha256'][:16]}… (modified after export)")
