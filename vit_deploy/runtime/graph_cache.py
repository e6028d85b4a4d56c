"""ONNX Runtime's optimised graph, saved beside the model for a faster next start (torch-free)."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import onnxruntime as ort

from vit_deploy.runtime.files import sha256_file
from vit_deploy.runtime.providers import Provider

CACHE_DIR = ".ort-cache"


class OptimizedGraphCache:
    """ORT's optimised graph saved beside the model (`.ort-cache/`) for a faster next start.

    Keyed by model, providers, optimisation level and ORT version; used only when its
    sidecar says it was made from this very model file and its own hash still matches.
    """

    def __init__(self, path: Path, providers: list[Provider], optimization: str):
        key = "-".join(p.alias for p in providers)
        self.model = path
        self.graph = path.parent / CACHE_DIR / f"{path.stem}.{key}.{optimization}.ort{ort.__version__}.onnx"
        self.sidecar = self.graph.with_suffix(".json")
        self._fresh: str | None = None
        self._source_hash = ""
        self.hit = False

    def prepare(self, so: ort.SessionOptions) -> str:
        """The file to load; sets `so` to load the cached graph or to write a new one."""
        self._source_hash = sha256_file(self.model)
        try:
            record = json.loads(self.sidecar.read_text())
            if (record["source_sha256"] == self._source_hash
                    and sha256_file(self.graph) == record["sha256"]):
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                self.hit = True
                return str(self.graph)
        except (OSError, ValueError, KeyError):
            pass
        try:
            self.graph.parent.mkdir(exist_ok=True)
            fd, self._fresh = tempfile.mkstemp(prefix=".opt-", suffix=".onnx", dir=self.graph.parent)
            os.close(fd)
        except OSError as e:
            warnings.warn(f"cannot cache the optimised graph beside {str(self.model)!r}: {e}",
                          RuntimeWarning, stacklevel=4)
            return str(self.model)
        so.optimized_model_filepath = self._fresh
        return str(self.model)

    def store(self) -> None:
        fresh, self._fresh = self._fresh, None
        if fresh is None:
            return
        if os.path.getsize(fresh) == 0:
            os.unlink(fresh)
            return
        os.replace(fresh, self.graph)
        record = {"source_sha256": self._source_hash, "sha256": sha256_file(self.graph),
                  "onnxruntime": ort.__version__}
        tmp = self.sidecar.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.sidecar)
