"""Which provider ran each node, from ONNX Runtime's own profile of one small run."""

from __future__ import annotations

import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from vit_deploy.runtime.providers import captured_stderr, short_name

if TYPE_CHECKING:
    from vit_deploy.runtime.session import ViTSession


def profile_placement(s: ViTSession) -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        so = s.session_options()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "placement")
        providers = [(p, opts) for p, opts in zip(s.providers, _options_for(s))]
        with captured_stderr():
            session = ort.InferenceSession(str(s.model_path), so, providers=providers)
        static = s.input_shape[2:]
        P = s.patch_size or 1
        hw = tuple(static) if all(isinstance(d, int) for d in static) else (P, P)
        session.run(None, {s.input_name: np.zeros((1, s.in_chans, *hw), np.float32)})
        with open(session.end_profiling()) as f:
            events = json.load(f)
    out: dict[str, list[str]] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            provider = short_name(e["args"].get("provider", "?"))
            out.setdefault(provider, []).append(e["name"][: -len("_kernel_time")])
    return out


def _options_for(s: ViTSession) -> list[dict[str, Any]]:
    by_name = {p.name: p.options for p in s.requested}
    return [by_name.get(p, {}) for p in s.providers]
