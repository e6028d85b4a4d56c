"""Golden references: the proof that travels with a bundle (torch-free).

Export stores, in `references.bin`, PyTorch's fp32 outputs for a few inputs that are never
stored but regenerated from a seed, so `vit-deploy check` (and the JavaScript runtime's
`vit.check()`) can judge every provider and precision on a machine without PyTorch. The
manifest's `references` part says where each output lies in the file:

    {"file": "references.bin", "generator": "mulberry32-uniform-v1",
     "source": "pytorch fp32 (torch 2.13.0)",
     "cases": [{"name": "deploy", "seed": 1, "shape": [2, 3, 448, 448],
                "outputs": {"logits": {"offset": 0, "shape": [2, 1000]}}}]}

Offsets are in bytes from the start of the file; every output is little-endian float32 in
C order. A case made by `vit-deploy target` has `"target": NAME`: it is at one of that
target's bucket sizes, and `check` runs it through the target's bucket graphs (it is an
ordinary case to a reader that ignores the key: the dynamic graph takes any size).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.runtime.manifest_parts import BundleError, FileEntry, IOSpec, _is_int, _need
from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.sizes import MAX_SIDE

REFERENCES_FILE = "references.bin"
REFERENCES_ROLE = "references"
GENERATOR = "mulberry32-uniform-v1"
REFERENCE_BATCH = 2
# The reference set's bound: at most this fraction of the fp32 model file.
MAX_FRACTION = 0.05
MAX_CASES = 64


def mulberry32_uniform(seed: int, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """Generator "mulberry32-uniform-v1": element i (C order) is mulberry32's output after
    advancing the state i + 1 times, mapped to [-2, 2) in float64, rounded to float32.
    Counter-based, so it vectorises; JavaScript computes the same bytes with Math.imul."""
    n = int(np.prod(shape, dtype=np.int64))
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        a = ((np.uint64(seed % 2**32) + i * np.uint64(0x6D2B79F5)) % np.uint64(2**32)).astype(np.uint32)
        t = (a ^ (a >> np.uint32(15))) * (a | np.uint32(1))  # uint32 products wrap: Math.imul
        t = t ^ (t + (t ^ (t >> np.uint32(7))) * (t | np.uint32(61)))
        r = t ^ (t >> np.uint32(14))
    return (r.astype(np.float64) / 2.0**32 * 4.0 - 2.0).astype(np.float32).reshape(tuple(shape))


GENERATORS = {GENERATOR: mulberry32_uniform}


@dataclass(frozen=True)
class ReferenceOutput:
    offset: int  # bytes from the start of the file
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return 4 * int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True, kw_only=True)
class ReferenceCase:
    name: str
    seed: int
    shape: tuple[int, int, int, int]  # the input (batch, channels, height, width)
    outputs: Mapping[str, ReferenceOutput]
    target: str | None = None  # a bucket case of this edge target

    @property
    def resolution(self) -> tuple[int, int]:
        return self.shape[2], self.shape[3]

    @property
    def batch(self) -> int:
        return self.shape[0]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "shape": list(self.shape),
                "outputs": {n: {"offset": o.offset, "shape": list(o.shape)}
                            for n, o in self.outputs.items()},
                **({"target": self.target} if self.target is not None else {})}


@dataclass(frozen=True, kw_only=True)
class References:
    """The manifest's `references` part: which file, how inputs are made, whose outputs."""

    file: str
    generator: str
    source: str  # e.g. "pytorch fp32 (torch 2.13.0)"
    cases: tuple[ReferenceCase, ...]

    @property
    def nbytes(self) -> int:
        return sum(o.nbytes for c in self.cases for o in c.outputs.values())

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "generator": self.generator, "source": self.source,
                "cases": [c.to_dict() for c in self.cases]}

    def without_target(self, target: str) -> References:
        """These references less `target`'s bucket cases (before it is rebuilt)."""
        return References(file=self.file, generator=self.generator, source=self.source,
                          cases=tuple(c for c in self.cases if c.target != target))


def pack(cases: list[tuple[ReferenceCase, Mapping[str, np.ndarray]]], *, source: str,
         file: str = REFERENCES_FILE) -> tuple[References, bytes]:
    """References and the bytes of their file from (case, outputs by name): offsets are
    assigned here, in order (a case's own `outputs` offsets are ignored)."""
    blobs, placed, offset = [], [], 0
    for case, outputs in cases:
        where = {}
        for name, array in outputs.items():
            data = np.ascontiguousarray(array, dtype="<f4")
            where[name] = ReferenceOutput(offset, tuple(int(d) for d in data.shape))
            blobs.append(data.tobytes())
            offset += data.nbytes
        placed.append(ReferenceCase(name=case.name, seed=case.seed, shape=case.shape,
                                    outputs=where, target=case.target))
    refs = References(file=file, generator=GENERATOR, source=source, cases=tuple(placed))
    return refs, b"".join(blobs)


def read_outputs(path: str | Path, refs: References) -> list[dict[str, np.ndarray]]:
    """Every case's stored outputs, by name, from the references file at `path`."""
    data = Path(path).read_bytes()
    out = []
    for case in refs.cases:
        arrays = {}
        for name, o in case.outputs.items():
            if o.offset + o.nbytes > len(data):
                raise BundleError(f"{refs.file}: case {case.name!r} output {name!r} ends at byte "
                                  f"{o.offset + o.nbytes}, the file has {len(data)}")
            arrays[name] = np.frombuffer(data, dtype="<f4", count=o.nbytes // 4,
                                         offset=o.offset).reshape(o.shape).astype(np.float32)
        out.append(arrays)
    return out


def iter_references(path: str | Path, refs: References
                    ) -> Iterator[tuple[ReferenceCase, np.ndarray, dict[str, np.ndarray]]]:
    """(case, its input regenerated from the seed, its golden outputs by name)."""
    if refs.generator not in GENERATORS:
        raise BundleError(f"references use generator {refs.generator!r}; this version knows "
                          f"{sorted(GENERATORS)}")
    make = GENERATORS[refs.generator]
    for case, outputs in zip(refs.cases, read_outputs(path, refs)):
        yield case, make(case.seed, case.shape), outputs


def parse_references(data: Any, files: Mapping[str, FileEntry], io: IOSpec, config: ViTConfig,
                     where: str) -> References | None:
    """The manifest's `references` (None: a bundle from before they existed)."""
    if data is None:
        return None
    at = "references"
    _need(isinstance(data, dict) and isinstance(data.get("file"), str)
          and isinstance(data.get("generator"), str) and isinstance(data.get("source"), str)
          and isinstance(data.get("cases"), list) and len(data["cases"]) <= MAX_CASES, where,
          at, f"{{file, generator, source, cases: up to {MAX_CASES}}}", data)
    file = data["file"]
    _need(file in files and files[file].role == REFERENCES_ROLE, where, f"{at}.file",
          f"a file listed under files with role {REFERENCES_ROLE!r}", file)
    size, names = files[file].size, set(io.output_names)
    cases = []
    for i, c in enumerate(data["cases"]):
        ca = f"{at}.cases[{i}]"
        shape = c.get("shape") if isinstance(c, dict) else None
        # the shape's fit to the model (channels, patch multiples) is the session's to check
        # when the case runs: here a config edited by hand is reported as what it is
        _need(isinstance(shape, list) and len(shape) == 4
              and all(_is_int(v, 1, MAX_SIDE) for v in shape)
              and isinstance(c.get("name"), str) and _is_int(c.get("seed"), 0, 2**32 - 1)
              and isinstance(c.get("outputs"), dict) and bool(c["outputs"])
              and (c.get("target") is None or isinstance(c["target"], str)), where, ca,
              "{name, seed: 0..2^32-1, shape: [batch, channels, H, W], outputs: "
              "{name: {offset, shape}}, target?}", c)
        outputs = {}
        for name, o in c["outputs"].items():
            _need(name in names and isinstance(o, dict) and _is_int(o.get("offset"))
                  and o["offset"] % 4 == 0 and isinstance(o.get("shape"), list)
                  and all(_is_int(v, 1) for v in o["shape"]), where, f"{ca}.outputs",
                  f"outputs the bundle declares ({sorted(names)}) with a byte offset (a "
                  f"multiple of 4) and a shape", {name: o})
            out = ReferenceOutput(o["offset"], tuple(o["shape"]))
            _need(out.shape[0] == shape[0] and out.offset + out.nbytes <= size, where,
                  f"{ca}.outputs[{name!r}]", f"batch {shape[0]} first, inside the "
                  f"{size}-byte {file}", o)
            outputs[name] = out
        cases.append(ReferenceCase(name=c["name"], seed=c["seed"], shape=tuple(shape),
                                   outputs=outputs, target=c.get("target")))
    return References(file=file, generator=data["generator"], source=data["source"],
                      cases=tuple(cases))
