"""Which provider ran each node, from ONNX Runtime's own profile of one small run."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np
import onnxruntime as ort

from vit_deploy.runtime.providers import captured_stderr, short_name


def profile_placement(model: str | os.PathLike, options: ort.SessionOptions,
                      providers: list[tuple[str, dict[str, Any]]], input_name: str,
                      input_chw: tuple[int, int, int]) -> dict[str, list[str]]:
    """{provider alias: [node names]} from ORT's profile of one run of `model` on a zero
    batch of one (C, H, W) input, the providers given as (name, options) pairs."""
    with tempfile.TemporaryDirectory() as tmp:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "placement")
        with captured_stderr():
            session = ort.InferenceSession(str(model), options, providers=providers)
        session.run(None, {input_name: np.zeros((1, *input_chw), np.float32)})
        with open(session.end_profiling()) as f:
            events = json.load(f)
    out: dict[str, list[str]] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            provider = short_name(e["args"].get("provider", "?"))
            out.setdefault(provider, []).append(e["name"][: -len("_kernel_time")])
    return out
