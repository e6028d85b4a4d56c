"""Where bench numbers come from: the machine (CPU, flags, cores, GPU, library versions),
this process's memory, and how many cores' worth its threads get right now."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np


def rss_mb(*, peak: bool = False) -> float:
    """Resident set size of this process now (or its peak), in MB (Linux /proc; elsewhere
    the peak from getrusage)."""
    key = "VmHWM:" if peak else "VmRSS:"
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_memory_mb() -> float | None:
    """Used memory of GPU 0 from nvidia-smi, or None where there is no NVIDIA GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits", "-i", "0"], capture_output=True, text=True, timeout=10)
        return float(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def environment() -> dict[str, Any]:
    """Where the numbers came from: CPU, flags, cores, GPU, library versions."""
    import onnxruntime as ort

    env: dict[str, Any] = {"machine": platform.machine(), "system": platform.system(),
                           "python": platform.python_version(), "cores": os.cpu_count(),
                           "onnxruntime": ort.__version__,
                           "ort_providers_listed": ort.get_available_providers()}
    env["cpu"] = cpu_name()
    try:
        flags = re.search(r"^flags\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
        have = set(flags.group(1).split()) if flags else set()
        env["cpu_flags"] = sorted(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                                              "avx_vnni", "amx_int8", "amx_bf16", "fma") if f in have)
    except OSError:
        pass
    for dist in ("onnx", "torch", "numpy"):  # read, not imported (torch takes seconds)
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[dist] = None
    env["gpu"] = gpu_name()
    return env


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, else what platform says)."""
    try:
        model = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        model = None
    return model.group(1) if model else platform.processor()


def gpu_name() -> str | None:
    """nvidia-smi's name, driver and memory of each GPU, or None where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def int8_gemm(threads: int, size: int) -> tuple[Any, dict[str, np.ndarray]]:
    """An ONNX Runtime CPU session running one size³ u8 × s8 MatMulInteger (idle threads
    not spinning), and its input."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (size, size), dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "gemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [size, size])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session, {"a": rng.integers(0, 256, (size, size), dtype=np.uint8)}


def thread_scaling(threads: int, *, size: int = 1024, repeats: int = 15,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """How many cores' worth `threads` get right now: an int8 matmul's best time on one
    thread ÷ on `threads`, back to back. Measured on a 2-vCPU cloud guest: 2.0 at some
    moments and 0.9-1.2 at others, minute to minute (the second vCPU shared a physical
    core with another guest), and every model's latency moved with it (docs/cpu-speed.md)."""
    best = []
    for n in (1, threads):
        session, feed = int8_gemm(n, size)
        session.run(None, feed)
        times = []
        for _ in range(repeats):
            t0 = clock()
            session.run(None, feed)
            times.append(clock() - t0)
        best.append(min(times))
    return best[0] / best[1]
