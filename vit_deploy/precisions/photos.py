"""Judging a precision on real photographs: which images, what agrees, which layers cost.

Noise inputs and random weights hide what breaks int8 on trained models (activation
outliers): every precision is judged on real images, the user's (`--eval DIR`, or a
held-out quarter of `--calib DIR`) or, by default, the photographs shipped in
vit_deploy/data/photos (held out from the default calibration set). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from vit_deploy.precisions.agreement import (CONFIDENCE, expected_worst, neighbours_kept,
                                             per_photograph, top_k_agree)
from vit_deploy.precisions.probe import tensor_probe
from vit_deploy.runtime.contract import COSINE_MIN, LOGITS_NAME, tolerance_class
from vit_deploy.runtime.files import not_a_file
from vit_deploy.runtime.sizes import format_resolution

SHIPPED = "photos"  # the name that selects the shipped photographs
HOLD_OUT_EVERY = 4  # --calib DIR without --eval: every 4th image is held out to judge
VIEW_BOX = (0.0, 0.0, 2 / 3, 2 / 3), (1 / 3, 1 / 3, 1.0, 1.0)  # two crops beside the whole
# Bounds on what judging holds in memory: at most MAX_JUDGED images of a folder (each whole
# and two crops: 3x as many views), each decoded image reduced (a box filter, by a whole
# factor) until its shorter side is under 2 x VIEW_SIDE, far above any judged size's input.
MAX_JUDGED = 64
CROPS_UNDER = 32  # photographs: a smaller judging set is judged whole and cropped
VIEW_SIDE = 1024


@dataclass(frozen=True)
class EvalImages:
    """The real images a precision is judged on, and how the report names them."""

    paths: tuple[Path, ...]
    source: str
    pixels: np.ndarray | None = None  # (N, H, W, 3) uint8 images instead of files, as they are
    crops: bool = True  # each file whole and two crops (VIEW_BOX); False: whole only

    def __len__(self) -> int:
        if self.pixels is not None:
            return len(self.pixels)
        return len(self.paths) * self._framings

    @property
    def _framings(self) -> int:
        return 1 + len(VIEW_BOX) if self.crops else 1

    @property
    def photographs(self) -> int:
        """Distinct images (a photograph and its crops are one)."""
        return len(self.pixels) if self.pixels is not None else len(self.paths)

    def groups(self) -> list[int]:
        """For each view, the index of the image it was taken from."""
        return [i // (1 if self.pixels is not None else self._framings)
                for i in range(len(self))]

    def labels(self) -> list[str]:
        """For each view, how a report names it: the file and its framing."""
        if self.pixels is not None:
            return [f"image {i}" for i in range(len(self.pixels))]
        framings = ["whole"] + [f"crop {a:.2g},{b:.2g}-{c:.2g},{d:.2g}"
                                for a, b, c, d in VIEW_BOX][:self._framings - 1]
        return [f"{path.name} ({framing})" for path in self.paths for framing in framings]

    def views(self) -> list[Any]:
        """Each image whole and (with `crops`) two overlapping crops (top-left and
        bottom-right two thirds): three framings of one photograph, as a user's images vary."""
        from PIL import Image

        from vit_deploy.runtime.preprocess import load_image

        if self.pixels is not None:
            return [Image.fromarray(p) for p in self.pixels]
        out = []
        for path in self.paths:
            image = load_image(path)  # hostile files refused with a clear ImageError
            factor = min(image.size) // VIEW_SIDE
            if factor >= 2:  # a 50-megapixel photograph held 36 times over is gigabytes
                image = image.reduce(factor)
            w, h = image.size
            out.append(image)
            if self.crops:
                out += [image.crop((round(a * w), round(b * h), round(c * w), round(d * h)))
                        for a, b, c, d in VIEW_BOX]
        return out


def image_files(folder: str | Path, what: str) -> list[Path]:
    """The images Pillow opens in `folder` (recursively; files named with its suffixes),
    sorted; refused if none, or if one of them is not a regular file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{what} must be a folder of images or '{SHIPPED}', got "
                         f"{str(folder)!r}")
    suffixes = image_suffixes()
    named = sorted(p for p in folder.rglob("*") if p.suffix.lower() in suffixes
                   and not p.is_dir())
    # one policy for every unusable entry named like an image: refused, naming it (a FIFO
    # or a link to /dev/zero is never opened; an empty or broken image fails as it is read)
    bad = [(p, why) for p in named if (why := not_a_file(p))]
    if bad:
        p, why = bad[0]
        raise ValueError(f"{what}: {str(p)!r} is {why}, not an image file"
                         + (f" (and {len(bad) - 1} more such entries)" if len(bad) > 1 else "")
                         + f"; a folder of images holds regular image files only: move it out "
                         f"or point {what} at another folder")
    files = named
    if not files:
        raise ValueError(f"no images (files Pillow opens: .png, .jpg, .webp, ...) in "
                         f"{str(folder)!r} ({what})")
    return files


def image_suffixes() -> set[str]:
    """File suffixes Pillow can open here (its own registry)."""
    from PIL import Image

    return {ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN}


def shipped(role: str) -> list[Path]:
    from vit_deploy.data import photo_paths

    return photo_paths(role)


def digits_images() -> EvalImages:
    """The trained test model's held-out digits (its real inputs), as they are."""
    from vit_deploy.data import load_digits_split

    pixels = load_digits_split()["test_images"]
    return EvalImages((), f"the {len(pixels)} held-out digits (the test model's own data)",
                      pixels=pixels)


def fp32_photo_batches(bundle: Path, manifest: Any, sizes: list[tuple[int, int]],
                       images: EvalImages | None = None
                       ) -> dict[tuple[int, int], tuple[np.ndarray, dict[str, np.ndarray]]]:
    """{size: (real images preprocessed at the size as the runtime does, the bundle's fp32
    graph's outputs for them, on the CPU provider)}: `images`, by default the photographs
    shipped with the package (held out from calibration), each whole."""
    from vit_deploy.runtime.preprocess import Preprocess
    from vit_deploy.runtime.session import ViTSession

    views = (images.views() if images is not None else
             EvalImages(tuple(shipped("eval")), "").views()[::1 + len(VIEW_BOX)])
    out = {}
    with ViTSession(manifest.model_path(bundle, "fp32"), provider="cpu") as fp32:
        for hw in sizes:
            pre = Preprocess.from_manifest(manifest, resolution=hw,
                                           resize="shorter_side_center_crop")
            x = np.stack([pre.array(view) for view in views])
            out[hw] = (x, fp32.run_all(x))
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def judged_set(files: Sequence[Path], source: str) -> EvalImages:
    """`files` as the images that judge: under CROPS_UNDER photographs each whole and two
    crops (more framings of few photographs), else each whole (the time of judging)."""
    crops = len(files) < CROPS_UNDER
    return EvalImages(tuple(files), source + (", each whole and two crops" if crops else
                                              ", each whole"), crops=crops)


def resolve(calib: str | Path | None, eval_images: str | Path | None
            ) -> tuple[str | list[Path], EvalImages]:
    """(calibration source: 'digits' or image files, the images that judge).

    --eval DIR judges on DIR; without it a --calib DIR of 4 or more images gives every 4th
    image to judging and calibrates on the rest (a calibration file with the same content
    as a held-out one is left out of calibration); otherwise the shipped held-out
    photographs judge. No --calib: the shipped calibration photographs."""
    if calib is None or str(calib) == SHIPPED:
        calib_files: str | list[Path] = shipped("calib")
    elif str(calib) == "digits":
        calib_files = "digits"
    else:
        calib_files = image_files(calib, "--calib")
    if eval_images is not None and str(eval_images) != SHIPPED:
        found = image_files(eval_images, "--eval")
        files = found[:MAX_JUDGED]  # the first by name: said in the report
        judged = judged_set(files, (
            f"{_count(len(files), 'image')} in {eval_images}" if len(files) == len(found) else
            f"the first {len(files)} of the {len(found)} images in {eval_images} (by name; "
            f"at most {MAX_JUDGED} are judged)"))
        overlap = shared_images(files, calib_files if isinstance(calib_files, list) else [])
        if overlap:
            raise ValueError(f"--eval and --calib share {len(overlap)} image(s) (e.g. "
                             f"{overlap[0]}): judging must be on held-out images (compared "
                             f"by content: a link, another spelling or a copy of a "
                             f"calibration image is the same image)")
    elif eval_images is None and calib_files == "digits":
        judged = digits_images()
    elif eval_images is None and isinstance(calib_files, list) and calib is not None \
            and str(calib) != SHIPPED and len(calib_files) >= HOLD_OUT_EVERY:
        held = calib_files[HOLD_OUT_EVERY - 1::HOLD_OUT_EVERY]
        rest = [p for p in calib_files if p not in held]
        same = set(shared_images(rest, held))  # copies of a held-out image: not calibration
        calib_files = [p for p in rest if str(p) not in same]
        judged_held = held[:MAX_JUDGED]
        judged = judged_set(judged_held, f"{_count(len(judged_held), 'image')} of {calib} held "
                                         f"out from calibration (every {HOLD_OUT_EVERY}th"
                            + (f"; the first {MAX_JUDGED} of {len(held)} judged" if
                               len(held) > MAX_JUDGED else "")
                            + (f"; {len(same)} calibration file(s) with a held-out image's content "
                               f"left out"
                               if same else "") + ")")
    else:
        files = shipped("eval")
        judged = judged_set(files, f"{len(files)} real photographs shipped with vit-deploy, "
                                   f"held out from calibration")
    return calib_files, judged


def shared_images(judged: Sequence[Path], calibration: Sequence[Path]) -> list[str]:
    """The judged images that are calibration images too, by content (each file's sha256),
    whatever the spelling: a symlinked or `..`-spelled folder, or a copy. Names, sorted."""
    import hashlib

    def digests(files: Sequence[Path]) -> dict[str, Path]:
        return {hashlib.sha256(Path(f).read_bytes()).hexdigest(): Path(f) for f in files}

    calib = digests(calibration)
    return sorted(str(path) for digest, path in digests(judged).items() if digest in calib)


@dataclass(frozen=True)
class PhotoCase:
    """One output of the model on the real images at one size, against fp32."""

    resolution: tuple[int, int]
    output: str
    images: int
    cosine_min: float  # per image, the whole output (for patch tokens: the whole grid)
    cosine_median: float
    max_abs: float
    token_cosine_min: float | None  # per token: outputs (B, N, D) and grids (B, D, gh, gw)
    token_cosine_p1: float | None  # 1st percentile of the per-token cosine
    token_cosine_median: float | None
    top1_agree: float | None  # logits of a classifier: same arg-max as fp32
    floor: float  # the policy's cosine floor
    passed: bool
    photographs: int | None = None  # distinct photographs among the images (crops are views)
    worst_image: str | None = None  # the image whose cosine is cosine_min (file, framing)
    # the worst of as many other photographs, expected at agreement.CONFIDENCE
    expected_worst: float | None = None
    top5_agree: float | None = None  # logits: share of fp32's top 5 classes kept
    neighbours_kept: float | None = None  # embeddings: share of 5 nearest neighbours kept
    neighbours_worst: float | None = None  # ... for the image that keeps fewest

    @property
    def label(self) -> str:
        return f"{format_resolution(self.resolution)} {self.output}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"label": self.label}


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (n, d) float64 arrays; rows that are both zero agree."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    same = np.abs(a - b).max(axis=1) == 0
    return np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-300), same * 1.0)


def judge_photos(ref: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], *,
                 resolution: tuple[int, int], precision: str,
                 labels: Sequence[str] | None = None, groups: Sequence[int] | None = None,
                 others: int | None = None, confidence: float = CONFIDENCE
                 ) -> list[PhotoCase]:
    """Every output of `out` against fp32's `ref` on the same real images. `labels` name
    the images (the worst is named), `groups` say which photograph each image is a view of
    (the out-of-sample estimate counts photographs), `others`: how many other photographs
    the expected worst is for (by default as many as were judged), at `confidence`."""
    floor = COSINE_MIN[tolerance_class(precision)]
    cases = []
    for name, r in ref.items():
        o = out[name]
        if r.shape != o.shape:
            raise ValueError(f"output {name!r}: fp32 shape {r.shape}, {precision} {o.shape}")
        r64, o64 = r.astype(np.float64), o.astype(np.float64)
        per_image = _cosines(r64.reshape(len(r), -1), o64.reshape(len(o), -1))
        tokens = None
        if r.ndim == 3 and r.shape[1] > 1:  # (B, N, D): each token on its own
            tokens = _cosines(r64.reshape(-1, r.shape[-1]), o64.reshape(-1, o.shape[-1]))
        elif r.ndim == 4 and r.shape[2] * r.shape[3] > 1:  # a patch grid (B, D, gh, gw)
            tokens = _cosines(*(np.moveaxis(t, 1, -1).reshape(-1, r.shape[1]) for t in (r64, o64)))
        top1 = top5 = kept = None
        if name == LOGITS_NAME and r.ndim == 2 and r.shape[1] > 1:
            top1 = float((r.argmax(1) == o.argmax(1)).mean())
            top5 = top_k_agree(r64, o64)
        elif r.ndim == 2 and r.shape[1] > 1:  # an embedding: its nearest neighbours
            kept = neighbours_kept(r64, o64)
        photographs = per_photograph(per_image, groups)
        finite = bool(np.isfinite(o).all())
        worst = int(np.argmin(per_image))
        cases.append(PhotoCase(
            resolution=tuple(resolution), output=name, images=len(r),
            cosine_min=float(per_image.min()), cosine_median=float(np.median(per_image)),
            max_abs=float(np.abs(r64 - o64).max()),
            token_cosine_min=None if tokens is None else float(tokens.min()),
            token_cosine_p1=None if tokens is None else float(np.percentile(tokens, 1)),
            token_cosine_median=None if tokens is None else float(np.median(tokens)),
            top1_agree=top1, floor=floor,
            passed=finite and float(per_image.min()) >= floor,
            photographs=len(photographs),
            worst_image=labels[worst] if labels is not None and len(labels) == len(r) else None,
            expected_worst=expected_worst(photographs, others or len(photographs),
                                          confidence=confidence) if finite else None,
            top5_agree=top5,
            neighbours_kept=None if kept is None else float(kept.mean()),
            neighbours_worst=None if kept is None else float(kept.min())))
    return cases


def layer_costs(reference: Path, candidate: Path, x: np.ndarray,
                layers: Mapping[str, str], *, top: int = 3) -> list[dict[str, Any]]:
    """The linear layers (module path -> fp32 node name, in graph order) that add the most
    error on `x`. Each layer's output is read from both models (the quantisers keep the
    names of the tensors between layers); its relative error (|Δ| / |fp32| over the batch)
    minus that of the layer before it is the error it adds, with what lies between (an
    input scaled by smoothing is not compared: only the layers' outputs are). Largest
    first, the `top` of them."""
    ref_model = onnx.load(str(reference))
    cand_model = onnx.load(str(candidate))
    nodes = {n.name: n for n in ref_model.graph.node}
    produced = {o for n in cand_model.graph.node for o in n.output}
    outputs = {path: nodes[name].output[0] for path, name in layers.items()
               if name in nodes and nodes[name].output[0] in produced}
    if not outputs:
        return []
    names = list(dict.fromkeys(outputs.values()))
    a, b = tensor_probe(ref_model, names)(x), tensor_probe(cand_model, names)(x)
    costs, before = [], 0.0
    for path, t in outputs.items():
        r = a[t].astype(np.float64)
        error = float(np.linalg.norm(b[t].astype(np.float64) - r) / max(np.linalg.norm(r), 1e-30))
        costs.append({"layer": path, "added_error": round(error - before, 6),
                      "output_error": round(error, 6)})
        before = error
    return sorted(costs, key=lambda c: -c["added_error"])[:top]
