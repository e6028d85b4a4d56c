"""Retrieval agreement in `check`, for a bundle that embeds (its manifest's purpose): how many
of each photograph's 5 nearest neighbours (cosine, among the package's 50 judging
photographs, at the deploy size) each precision on each provider keeps, against the fp32
file on the CPU (the file the check itself holds to PyTorch). What a search index built on
the vectors keeps, in the user's terms; reported beside the cosines, not a pass or fail
(quantize's verdict decides what is written: docs/precisions.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.data import photo_paths
from vit_deploy.precisions.agreement import NEIGHBOURS, neighbours_kept
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.preprocess import Preprocess
from vit_deploy.runtime.session import ViTSession

CHUNK = 8  # images a run


@dataclass(frozen=True)
class Retrieval:
    provider: str
    precision: str
    resolution: tuple[int, int]
    output: str
    photographs: int
    mean: float  # the mean share of the k nearest kept
    worst: float  # the photograph that keeps fewest: its share
    worst_image: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "k": NEIGHBOURS, "reference": "fp32 on cpu"}

    def __str__(self) -> str:
        return (f"{self.provider} {self.precision} {self.resolution[0]}x{self.resolution[1]}: "
                f"{100 * self.mean:.1f} % of the {NEIGHBOURS} nearest kept, worst "
                f"{round(self.worst * NEIGHBOURS)} of {NEIGHBOURS} ({self.worst_image})")


class RetrievalJudge:
    """The judging photographs prepared once, fp32's vectors on the CPU computed once."""

    def __init__(self, bundle: Path, manifest: Manifest):
        self.bundle, self.output = bundle, manifest.purpose.embedding
        self.photos = photo_paths("eval")
        self.resolution = manifest.deploy_resolution
        self.batches = Preprocess.from_manifest(manifest).batches(self.photos)
        self._reference: np.ndarray | None = None

    @staticmethod
    def applies(manifest: Manifest) -> bool:
        return manifest.purpose.embedding is not None and not manifest.naflex

    def vectors(self, session: Any) -> np.ndarray:
        out = np.zeros((len(self.photos), 0), np.float32)
        for indices, batch in self.batches:
            got = np.concatenate([session.run_all(batch[i:i + CHUNK])[self.output]
                                  for i in range(0, len(batch), CHUNK)])
            if out.shape[1] == 0:
                out = np.zeros((len(self.photos), got.shape[1]), np.float32)
            out[indices] = got
        return out

    def judge(self, provider: str, precision: str, session: Any) -> Retrieval | None:
        if self._reference is None:
            with ViTSession(self.bundle, precision="fp32") as s:
                self._reference = self.vectors(s)
        kept = neighbours_kept(self._reference, self.vectors(session))
        if kept is None:
            return None
        worst = int(np.argmin(kept))
        return Retrieval(provider, precision, tuple(self.resolution), self.output,
                         len(self.photos), float(kept.mean()), float(kept[worst]),
                         self.photos[worst].name)
