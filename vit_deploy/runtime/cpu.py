"""Which int8 kernels this CPU gives ONNX Runtime, read from the operating system.

int8 numerics depend on the CPU (docs/precisions.md, "int8 and the CPU"): ONNX Runtime multiplies uint8 activations by
int8 weights with `vpmaddubsw` on x86 CPUs without VNNI, which adds two products into a
saturating 16-bit sum. With 8-bit weights a pair reaches 2 x 255 x 128 = 65280 and is
clipped at 32767; with 7-bit weights (`reduce_range`) it stays under 2 x 255 x 64 = 32640.
CPUs with AVX-512 VNNI, AVX-VNNI or AMX accumulate in 32 bits, and so do ARM64's kernels.
Everything here takes the facts as arguments, so a test can ask about any CPU.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

# x86 flags (as Linux names them in /proc/cpuinfo) whose kernels accumulate u8 x s8 products
# in 32 bits: any one of them makes full-range (8-bit) int8 weights exact
X86_INT8_EXACT = ("avx512_vnni", "avx_vnni", "amx_int8")
ARM64_MACHINES = ("aarch64", "arm64")
X86_MACHINES = ("x86_64", "amd64", "i386", "i686", "x86")

# What a quantised model's recipe says it needs (the manifest's `recipe.cpu`)
ANY_CPU = "any"
VNNI_CPU = "vnni"
INT8_CPUS = (ANY_CPU, VNNI_CPU)
REQUIREMENT_TEXT = {
    ANY_CPU: "any CPU (7-bit weights: no 16-bit sum can saturate)",
    VNNI_CPU: "x86 with AVX-512 VNNI, AVX-VNNI or AMX, or ARM64 (8-bit weights saturate "
              "the 16-bit sums of x86 CPUs with AVX2 only)",
}


def parse_cpuinfo(text: str) -> frozenset[str]:
    """The feature flags of /proc/cpuinfo's first processor (x86 `flags`, ARM `Features`)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags, or None where the OS does not say (not Linux)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return None


def int8_kernel(machine: str | None = None, flags: Iterable[str] | None = None) -> str:
    """The kind of int8 kernel ONNX Runtime's CPU provider runs here, in words."""
    machine = (machine or platform.machine()).lower()
    if machine in ARM64_MACHINES:
        return "arm64 (32-bit sums)"
    if machine not in X86_MACHINES:
        return f"unknown ({machine})"
    if flags is None:
        flags = cpu_flags()
    if flags is None:
        return "x86 (the OS does not list its features)"
    have = set(flags)
    if "amx_int8" in have:
        return "x86 AMX (32-bit sums)"
    if "avx512_vnni" in have or "avx_vnni" in have:
        return "x86 VNNI (32-bit sums)"
    if "avx2" in have:
        return "x86 AVX2 without VNNI (saturating 16-bit sums)"
    return "x86 without AVX2 (32-bit sums)"  # SSE kernels widen to 32 bits


def meets(requirement: str, machine: str | None = None,
          flags: Iterable[str] | None = None) -> bool | None:
    """Whether this CPU runs an int8 file of recipe `requirement` exactly; None when the
    OS does not say."""
    if requirement == ANY_CPU:
        return True
    if requirement != VNNI_CPU:
        raise ValueError(f"int8 CPU requirement must be one of {INT8_CPUS}, got {requirement!r}")
    kernel = int8_kernel(machine, flags)
    if kernel.startswith(("unknown", "x86 (the OS")):
        return None
    return "saturating" not in kernel


def int8_warning(requirement: str | None, provider: str) -> str | None:
    """A warning for running an int8 file of recipe `requirement` on `provider` here, or
    None when it is exact (GPU providers accumulate in 32 bits)."""
    if requirement is None or provider != "CPUExecutionProvider":
        return None
    ok = meets(requirement)
    if ok:
        return None
    return (f"this int8 file has 8-bit weights, exact on {REQUIREMENT_TEXT[requirement]}; "
            + (f"this CPU ({int8_kernel()}) saturates them: expect wrong outputs (re-quantise "
               f"with --int8-cpu any)" if ok is False else
               "cannot tell whether this CPU has VNNI (the OS does not list its features)"))
