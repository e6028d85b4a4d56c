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
    if manifest["format"] != BUNDLE_FORMAT or manifest["format_version"] > BUNDLE_FORMAT_VERSION:
        raise BundleError(
            f"{str(path)!r} has format {manifest['format']!r} v{manifest['format_version']}; "
            f"this version reads {BUNDLE_FORMAT!r} up to v{BUNDLE_FORMAT_VERSION}")
    if verify:
        verify_files(root, manifest)
    return manifest


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
