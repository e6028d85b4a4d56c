"""A NaFlex bundle's golden references (torch-free): PyTorch's fp32 outputs for a few batches
of images of different aspect ratios, so `vit-deploy check --reference bundle` judges every
provider and precision without PyTorch. The images are never stored: each is regenerated
from its seed and size (NAFLEX_IMAGE_GENERATOR), then preprocessed by the bundle's own rule.
The manifest's `naflex_references` part says where each output lies in the file:

    {"file": "references.bin", "generator": "mulberry32-rgb8-v1", "source": "pytorch fp32 ...",
     "cases": [{"name": "mixed", "images": [{"seed": 11, "size": [64, 16]}, ...],
                "outputs": {"pooled": {"offset": 0, "shape": [5, 768]},
                            "last_hidden_state": {"offset": 15360, "shape": [5, 256, 768]}}}]}

Every output is little-endian float32 in C order; last_hidden_state's padding rows are
zeros (they are not outputs). Kept apart from `references` (NCHW cases, also read by the
JavaScript runtime) so no reader of that part meets inputs it cannot make.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.runtime.manifest_parts import FileEntry, IOSpec, _is_int, _need
from vit_deploy.runtime.references import (ReferenceOutput, mulberry32_uniform,
                                           parse_outputs, place_outputs, read_outputs,
                                           references_file)
from vit_deploy.runtime.sizes import MAX_SIDE

NAFLEX_IMAGE_GENERATOR = "mulberry32-rgb8-v1"
MAX_IMAGES = 64  # per case
# H x W x 3 summed over a case's images, checked before any is generated (float64 here:
# 128 MiB at most; a manifest asking for 8192x8192 images once took 6.3 GB)
MAX_VALUES = 2**24


def reference_image(seed: int, size: tuple[int, int]) -> np.ndarray:
    """Generator "mulberry32-rgb8-v1": an (H, W, 3) uint8 image, mulberry32-uniform-v1's
    values in [-2, 2) mapped to 0..255 (floor((u + 2) * 64))."""
    u = mulberry32_uniform(seed, (size[0], size[1], 3)).astype(np.float64)
    return np.clip(np.floor((u + 2) * 64), 0, 255).astype(np.uint8)


@dataclass(frozen=True, kw_only=True)
class NaFlexCase:
    name: str
    images: tuple[tuple[int, tuple[int, int]], ...]  # (seed, (H, W)) per image
    outputs: Mapping[str, ReferenceOutput]

    def inputs(self) -> list[np.ndarray]:
        return [reference_image(seed, size) for seed, size in self.images]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name,
                "images": [{"seed": seed, "size": list(size)} for seed, size in self.images],
                "outputs": {n: {"offset": o.offset, "shape": list(o.shape)}
                            for n, o in self.outputs.items()}}


@dataclass(frozen=True, kw_only=True)
class NaFlexReferences:
    file: str
    source: str
    cases: tuple[NaFlexCase, ...]
    generator: str = NAFLEX_IMAGE_GENERATOR

    @property
    def nbytes(self) -> int:
        return sum(o.nbytes for c in self.cases for o in c.outputs.values())

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "generator": self.generator, "source": self.source,
                "cases": [c.to_dict() for c in self.cases]}


def pack_naflex(cases: Sequence[tuple[str, Sequence[tuple[int, tuple[int, int]]],
                                      Mapping[str, np.ndarray]]], *, file: str, source: str
                ) -> tuple[NaFlexReferences, bytes]:
    """(name, images, outputs by name) per case -> the references and their file's bytes."""
    blobs, placed, offset = [], [], 0
    for name, images, outputs in cases:
        where, offset = place_outputs(outputs, blobs, offset)
        placed.append(NaFlexCase(name=name, outputs=where,
                                 images=tuple((int(s), (int(h), int(w))) for s, (h, w) in images)))
    return NaFlexReferences(file=file, source=source, cases=tuple(placed)), b"".join(blobs)


def iter_naflex_references(path: str | Path, refs: NaFlexReferences
                           ) -> Iterator[tuple[NaFlexCase, list[np.ndarray], dict[str, np.ndarray]]]:
    """(case, its images, its stored outputs by name) per case."""
    for case, outs in zip(refs.cases, read_outputs(path, refs)):
        yield case, case.inputs(), outs


def parse_naflex_references(data: Any, files: Mapping[str, FileEntry], io: IOSpec,
                            where: str) -> NaFlexReferences | None:
    """The manifest's `naflex_references` (None: absent)."""
    if data is None:
        return None
    at = "naflex_references"
    _need(io.naflex, where, at, "absent from a bundle whose inputs are not NaFlex's", "present")
    file, size = references_file(data, files, where, at, generator=NAFLEX_IMAGE_GENERATOR)
    names = set(io.output_names)
    cases = []
    for i, c in enumerate(data["cases"]):
        ca = f"{at}.cases[{i}]"
        images = c.get("images") if isinstance(c, dict) else None
        _need(isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(images, list)
              and 1 <= len(images) <= MAX_IMAGES and all(
                  isinstance(im, dict) and _is_int(im.get("seed"), 0, 2**32 - 1)
                  and isinstance(im.get("size"), list) and len(im["size"]) == 2
                  and all(_is_int(v, 1, MAX_SIDE) for v in im["size"]) for im in images)
              and sum(im["size"][0] * im["size"][1] * 3 for im in images) <= MAX_VALUES
              and isinstance(c.get("outputs"), dict) and bool(c["outputs"]), where, ca,
              f"{{name, images: 1..{MAX_IMAGES} of {{seed, size: [H, W]}} ({MAX_VALUES} "
              f"pixel values at most), outputs}}", c)
        outputs = parse_outputs(c["outputs"], names, len(images), file, size, where, ca)
        cases.append(NaFlexCase(name=c["name"], outputs=outputs, images=tuple(
            (im["seed"], (im["size"][0], im["size"][1])) for im in images)))
    return NaFlexReferences(file=file, source=data["source"], cases=tuple(cases))


# The cases export stores and check runs, (H, W): width:height 1:1, 4:1, 1:4, 3:2, 2:3, 16:9
# in one mixed batch, then a tall (1:4) and a wide (8:1) image alone (a batch of one is
# padded differently).
NAFLEX_SIZES = ((64, 64), (32, 128), (128, 32), (60, 90), (90, 60), (45, 80))
REFERENCE_CASES: tuple[tuple[str, tuple[tuple[int, tuple[int, int]], ...]], ...] = (
    ("mixed", tuple((11 + i, hw) for i, hw in enumerate(NAFLEX_SIZES))),
    ("tall", ((31, (128, 32)),)),
    ("wide", ((32, (24, 192)),)))
