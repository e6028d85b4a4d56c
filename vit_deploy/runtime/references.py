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
C order. A case with `"pixels": {"offset", "mean", "std", "scale"}` is a real photograph
(its seed is unused): its input is stored as uint8 pixels, (batch, channels, H, W) in C
order at that offset, already resized and cropped by the bundle's preprocessing, and
becomes the model input as preprocessing makes it, in float32: (pixels · scale − mean) / std
per channel. So `check` judges what a device will see, not only noise. A case made by `vit-deploy target` has `"target": NAME`: it is at one of that
target's bucket sizes, and `check` runs it through the target's bucket graphs (it is an
ordinary case to a reader that ignores the key: the dynamic graph takes any size).
"""

from __future__ import annotations

import dataclasses
import math
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


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class ReferenceOutput:
    offset: int  # bytes from the start of the file
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.shape)  # exact: a shape edited by hand may overflow int64


@dataclass(frozen=True, kw_only=True)
class ReferencePixels:
    """A real-photograph case's stored input: uint8 (B, C, H, W) at `offset`, and how it
    becomes the model input."""

    offset: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    scale: float

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "mean": list(self.mean), "std": list(self.std),
                "scale": self.scale}

    def input(self, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """The model input: (pixels · scale − mean) / std in float32, as Preprocess does."""
        n = int(np.prod(shape, dtype=np.int64))
        pixels = np.frombuffer(data, dtype=np.uint8, count=n, offset=self.offset).reshape(shape)
        x = pixels.astype(np.float32) * np.float32(self.scale)
        mean = np.asarray(self.mean, np.float32)[:, None, None]
        return ((x - mean) / np.asarray(self.std, np.float32)[:, None, None]).astype(np.float32)


@dataclass(frozen=True, kw_only=True)
class ReferenceCase:
    name: str
    seed: int
    shape: tuple[int, int, int, int]  # the input (batch, channels, height, width)
    outputs: Mapping[str, ReferenceOutput]
    target: str | None = None  # a bucket case of this edge target
    pixels: ReferencePixels | None = None  # a real photograph's stored input

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
                **({"target": self.target} if self.target is not None else {}),
                **({"pixels": self.pixels.to_dict()} if self.pixels is not None else {})}


@dataclass(frozen=True, kw_only=True)
class References:
    """The manifest's `references` part: which file, how inputs are made, whose outputs."""

    file: str
    generator: str
    source: str  # e.g. "pytorch fp32 (torch 2.13.0)"
    cases: tuple[ReferenceCase, ...]

    @property
    def nbytes(self) -> int:
        """The outputs' bytes (what the bound is on; stored pixels have their own)."""
        return sum(o.nbytes for c in self.cases for o in c.outputs.values())

    @property
    def file_bytes(self) -> int:
        """The references file's size: the outputs and the photographs' pixels (each
        padded to 4 bytes)."""
        pixels = [int(np.prod(c.shape)) for c in self.cases if c.pixels is not None]
        return self.nbytes + sum(n + -n % 4 for n in pixels)

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "generator": self.generator, "source": self.source,
                "cases": [c.to_dict() for c in self.cases]}

    def without_target(self, target: str) -> References:
        """These references less `target`'s bucket cases (before it is rebuilt)."""
        return References(file=self.file, generator=self.generator, source=self.source,
                          cases=tuple(c for c in self.cases if c.target != target))


def place_outputs(outputs: Mapping[str, np.ndarray], blobs: list[bytes], offset: int
                  ) -> tuple[dict[str, ReferenceOutput], int]:
    """Each output appended to `blobs` as little-endian float32 from byte `offset`: where
    each lies, and the offset after them."""
    where = {}
    for name, array in outputs.items():
        data = np.ascontiguousarray(array, dtype="<f4")
        where[name] = ReferenceOutput(offset, tuple(int(d) for d in data.shape))
        blobs.append(data.tobytes())
        offset += data.nbytes
    return where, offset


def pack(cases: list[tuple[ReferenceCase, Mapping[str, np.ndarray]]], *, source: str,
         file: str = REFERENCES_FILE,
         pixels: Mapping[str, np.ndarray] | None = None) -> tuple[References, bytes]:
    """References and the bytes of their file from (case, outputs by name): offsets are
    assigned here, in order (a case's own `outputs` offsets are ignored). `pixels`: the
    uint8 inputs of the real-photograph cases, by case name, stored after its outputs
    (padded to 4 bytes, so every float32 output stays aligned)."""
    blobs, placed, offset = [], [], 0
    pixels = pixels or {}
    for case, outputs in cases:
        where, offset = place_outputs(outputs, blobs, offset)
        stored = None
        if case.pixels is not None:
            raw = np.ascontiguousarray(pixels[case.name], dtype=np.uint8)
            if raw.shape != tuple(case.shape):
                raise ValueError(f"case {case.name!r}: pixels {raw.shape}, input {case.shape}")
            stored = dataclasses.replace(case.pixels, offset=offset)
            pad = -raw.nbytes % 4
            blobs.append(raw.tobytes() + b"\0" * pad)
            offset += raw.nbytes + pad
        placed.append(ReferenceCase(name=case.name, seed=case.seed, shape=case.shape,
                                    outputs=where, target=case.target, pixels=stored))
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


def read_pixels(path: str | Path, refs: References) -> dict[str, np.ndarray]:
    """The stored uint8 inputs of the real-photograph cases, by case name."""
    data = Path(path).read_bytes()
    return {c.name: np.frombuffer(data, dtype=np.uint8, count=int(np.prod(c.shape)),
                                  offset=c.pixels.offset).reshape(c.shape).copy()
            for c in refs.cases if c.pixels is not None}


def iter_references(path: str | Path, refs: References
                    ) -> Iterator[tuple[ReferenceCase, np.ndarray, dict[str, np.ndarray]]]:
    """(case, its input regenerated from the seed, its golden outputs by name)."""
    if refs.generator not in GENERATORS:
        raise BundleError(f"references use generator {refs.generator!r}; this version knows "
                          f"{sorted(GENERATORS)}")
    make = GENERATORS[refs.generator]
    data = Path(path).read_bytes()
    for case, outputs in zip(refs.cases, read_outputs(path, refs)):
        yield case, (make(case.seed, case.shape) if case.pixels is None
                     else case.pixels.input(data, case.shape)), outputs


def references_file(data: Any, files: Mapping[str, FileEntry], where: str, at: str,
                    generator: str | None = None) -> tuple[str, int]:
    """A references part's frame, {file, generator, source, cases} (`generator`: the one it
    must name; None: any), checked: (name, size) of its file, one listed under files with
    role references."""
    named = repr(generator) if generator else ""
    _need(isinstance(data, dict) and isinstance(data.get("file"), str)
          and (data.get("generator") == generator if generator
               else isinstance(data.get("generator"), str))
          and isinstance(data.get("source"), str) and isinstance(data.get("cases"), list)
          and len(data["cases"]) <= MAX_CASES, where, at,
          f"{{file, generator{': ' + named if named else ''}, source, cases: up to "
          f"{MAX_CASES}}}", data)
    file = data["file"]
    _need(isinstance(file, str) and file in files and files[file].role == REFERENCES_ROLE,
          where, f"{at}.file",
          f"a file listed under files with role {REFERENCES_ROLE!r}", file)
    return file, files[file].size


def parse_outputs(data: dict, names: set[str], batch: int, file: str, size: int, where: str,
                  at: str) -> dict[str, ReferenceOutput]:
    """A case's outputs, {name: {offset, shape}}: outputs the bundle declares, float32 at a
    byte offset (a multiple of 4), batch first, inside the `size`-byte `file`."""
    outputs = {}
    for name, o in data.items():
        _need(name in names and isinstance(o, dict) and _is_int(o.get("offset"))
              and o["offset"] % 4 == 0 and isinstance(o.get("shape"), list) and bool(o["shape"])
              and all(_is_int(v, 1) for v in o["shape"]), where, f"{at}.outputs",
              f"outputs the bundle declares ({sorted(names)}) with a byte offset (a multiple "
              f"of 4) and a shape of at least one dimension", {name: o})
        out = ReferenceOutput(o["offset"], tuple(o["shape"]))
        _need(out.shape[0] == batch and out.offset + out.nbytes <= size, where,
              f"{at}.outputs[{name!r}]", f"batch {batch} first, inside the {size}-byte {file}", o)
        outputs[name] = out
    return outputs


def parse_references(data: Any, files: Mapping[str, FileEntry], io: IOSpec, config: ViTConfig,
                     where: str) -> References | None:
    """The manifest's `references` (None: a bundle from before they existed)."""
    if data is None:
        return None
    at = "references"
    file, size = references_file(data, files, where, at)
    names = set(io.output_names)
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
        outputs = parse_outputs(c["outputs"], names, shape[0], file, size, where, ca)
        pixels = None
        if c.get("pixels") is not None:
            px = c["pixels"]
            channels = shape[1]
            _need(isinstance(px, dict) and _is_int(px.get("offset"))
                  and px["offset"] + int(np.prod(shape)) <= size
                  and all(isinstance(px.get(k), list) and len(px[k]) == channels
                          and all(_finite(v) for v in px[k]) for k in ("mean", "std"))
                  and all(v != 0 for v in px["std"]) and _finite(px.get("scale")), where,
                  f"{ca}.pixels", f"{{offset: uint8 {shape} inside the {size}-byte {file}, "
                  f"mean and std: {channels} numbers (std non-zero), scale}}", px)
            pixels = ReferencePixels(offset=px["offset"], mean=tuple(map(float, px["mean"])),
                                     std=tuple(map(float, px["std"])), scale=float(px["scale"]))
        cases.append(ReferenceCase(name=c["name"], seed=c["seed"], shape=tuple(shape),
                                   outputs=outputs, target=c.get("target"), pixels=pixels))
    return References(file=file, generator=data["generator"], source=data["source"],
                      cases=tuple(cases))
