"""Input sizes and patch grids (torch-free: used by the model, the CLI and the runtime)."""

from __future__ import annotations

import os
from pathlib import Path
import re
from typing import TYPE_CHECKING

from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError

if TYPE_CHECKING:
    from vit_deploy.runtime.config import ViTConfig

MAX_SIDE = 16384  # pixels per side of any resolution we accept (flags, manifests, images)
# The share of the available memory one block's attention may take (guard_memory); the
# JavaScript runtime's MEMORY_FRACTION (web/src/lib/common.mjs, tests/test_hostile_table.py).
MEMORY_FRACTION = 0.8
_RES_RE = re.compile(r"^\s*(\d{1,9})\s*(?:[xX×]\s*(\d{1,9})\s*)?$")


def parse_resolution(text: str | int) -> tuple[int, int]:
    """'448' -> (448, 448); '320x480' -> (320, 480) as (height, width)."""
    if isinstance(text, int):
        text = str(text)
    m = _RES_RE.match(str(text))
    if not m:
        raise ValueError(f"resolution must be N or HxW with positive integers (e.g. 448 or "
                         f"320x480), got {text!r}")
    h = int(m.group(1))
    w = int(m.group(2)) if m.group(2) is not None else h
    if h <= 0 or w <= 0:
        raise ValueError(f"resolution must be positive, got {text!r}")
    if max(h, w) > MAX_SIDE:
        raise ValueError(f"resolution sides must be at most {MAX_SIDE}, got {text!r}")
    return h, w


def format_resolution(hw: tuple[int, int]) -> str:
    return f"{hw[0]}x{hw[1]}"


def nearest_valid_sizes(size: int, patch: int) -> tuple[int, ...]:
    """The multiples of `patch` nearest to `size` (one or two of them, all >= patch)."""
    lower = (size // patch) * patch
    if lower < patch:
        return (patch,)
    if lower == size:
        return (size,)
    return (lower, lower + patch)


def require_patch_multiple(height: int, width: int, patch: int) -> None:
    """Raise ValueError unless both sides are positive multiples of the patch size."""
    for side, size in (("height", height), ("width", width)):
        if size < patch or size % patch:
            near = " or ".join(str(s) for s in nearest_valid_sizes(size, patch))
            raise ValueError(
                f"input {side} {size} is not a positive multiple of the patch size {patch}; "
                f"nearest valid sizes: {near}")


def grid_of(height: int, width: int, patch: int) -> tuple[int, int]:
    require_patch_multiple(height, width, patch)
    return height // patch, width // patch


class MemoryEstimateError(VitDeployError, ValueError):
    """A resolution whose attention would not fit in this machine's memory."""

    exit_code = BAD_INPUT


def attention_bytes(height: int, width: int, cfg: ViTConfig, *, batch: int = 1,
                    dtype_bytes: int = 4) -> int:
    """Peak working memory of one encoder block: the attention scores and their softmax
    (2 × heads × T²) plus the block's activations (≈ 8 × T × D), per image. T counts every
    token attention sees: the patches and all prefix tokens (class, distillation, registers)."""
    tokens = (height // cfg.patch_size) * (width // cfg.patch_size) + cfg.num_prefix_tokens
    return token_bytes(tokens, cfg, batch=batch, dtype_bytes=dtype_bytes)


def token_bytes(tokens: int, cfg: ViTConfig, *, batch: int = 1, dtype_bytes: int = 4) -> int:
    """attention_bytes for a sequence of `tokens` (a NaFlex batch: its padded patch count)."""
    return batch * dtype_bytes * (2 * cfg.heads * tokens * tokens + 8 * tokens * cfg.width)


CGROUP_ROOT = "/sys/fs/cgroup"  # where cgroup v2 (and v1's memory controller) are mounted
PROC_CGROUP = "/proc/self/cgroup"
_NO_LIMIT = 2**60  # v1 writes "no limit" as a number near 2**63


def available_memory() -> int | None:
    """Bytes this process may still take: the OS's available memory (Linux MemAvailable),
    or less where a memory cgroup (a container's limit, v1 or v2) leaves less; None where
    neither is known."""
    have, cgroup = _os_available(), cgroup_free()
    return cgroup if have is None else have if cgroup is None else min(have, cgroup)


def _os_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cgroup_free() -> int | None:
    """Bytes left under this process's memory cgroup limits (v2: memory.max minus
    memory.current; v1: memory.limit_in_bytes minus memory.usage_in_bytes), the tightest of
    its cgroup and every one above it; None where none sets a limit."""
    try:
        with open(PROC_CGROUP) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    root = Path(CGROUP_ROOT)
    tightest = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, files = root, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        here = base / path.lstrip("/")
        for folder in (here, *[p for p in here.parents if p.is_relative_to(base)]):
            limit, used = (_read_int(folder / name) for name in files)
            if limit is not None and limit < _NO_LIMIT:
                free = max(0, limit - (used or 0))
                tightest = free if tightest is None else min(tightest, free)
    return tightest


def _read_int(path: Path) -> int | None:
    """The number in a cgroup file ("max" and anything unreadable: None)."""
    try:
        text = path.read_text().strip()
    except (OSError, ValueError):
        return None
    return int(text) if text.isdigit() else None


def guard_memory(height: int, width: int, cfg: ViTConfig, *, batch: int = 1,
                 fraction: float = MEMORY_FRACTION) -> int:
    """Refuse (MemoryEstimateError) a size whose estimate exceeds `fraction` of the
    available memory; returns the estimate in bytes."""
    tokens = (height // cfg.patch_size) * (width // cfg.patch_size) + cfg.num_prefix_tokens
    return guard_tokens(tokens, cfg, batch=batch, fraction=fraction,
                        what=f"{height}x{width} (batch {batch})")


def guard_tokens(tokens: int, cfg: ViTConfig, *, batch: int = 1, what: str,
                 fraction: float = MEMORY_FRACTION, advice: str = "a smaller size",
                 override: str | None = "--force / allow_large=True") -> int:
    """guard_memory for a sequence of `tokens` per image (`what` names where they come
    from in the message, `override` how to try anyway, None: no way); returns the estimate
    in bytes."""
    need = token_bytes(tokens, cfg, batch=batch)
    have = available_memory()
    if have is not None and need > fraction * have:
        contained = (cgroup := cgroup_free()) is not None and cgroup <= have
        raise MemoryEstimateError(
            f"{what} means {tokens} tokens: attention needs about {need / 2**30:.1f} GiB, and "
            f"{have / 2**30:.1f} GiB are available"
            + (" under this process's memory cgroup (a container's limit)" if contained
               else "") + f"; use {advice}"
            + (f" (or {override} to try anyway)" if override else ""))
    return need
