"""Which resolution bucket an image goes to, and how it is brought there (torch-free).

Policy `aspect-then-area` (the one the manifest names):
1. nearest aspect ratio: the bucket whose H/W is closest to the image's in log space (so
   2:1 and 1:2 are equally far from 1:1);
2. then area: among buckets of that aspect, the smallest whose area is at least the
   image's, else the largest (never upscale more than needed, never throw away more
   detail than the largest bucket must);
3. the image is resized to cover the bucket, keeping its aspect ratio, and centre-cropped
   to it (the existing `shorter_side_center_crop` rule at the bucket's size).

Why not pad: a ViT has no attention mask, so pad tokens take part in attention and
change every output; why not stretch: it distorts shapes the model was trained on.
After step 1 the crop only removes the small aspect mismatch left.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from vit_deploy.runtime.contract import BUCKET_POLICIES
from vit_deploy.runtime.manifest import Manifest, bundle_path
from vit_deploy.runtime.manifest_parts import BundleError, TargetSpec
from vit_deploy.runtime.preprocess import Preprocess, group_by_shape, load_image

ASPECT_TIE = 1e-9  # log-aspect differences below this are ties


def choose_bucket(width: int, height: int, buckets: Sequence[tuple[int, int]], *,
                  policy: str = "aspect-then-area") -> tuple[int, int]:
    """The bucket (H, W) for an image of `width` × `height` pixels."""
    if policy not in BUCKET_POLICIES:
        raise ValueError(f"bucket policy must be one of {list(BUCKET_POLICIES)}, got {policy!r}")
    if not buckets:
        raise ValueError("no buckets to choose from")
    if width < 1 or height < 1:
        raise ValueError(f"image is {width}x{height}: expected at least 1x1 pixels")
    aspect = math.log(height / width)
    distance = {b: abs(math.log(b[0] / b[1]) - aspect) for b in buckets}
    nearest = min(distance.values())
    same = sorted((b for b in buckets if distance[b] - nearest <= ASPECT_TIE),
                  key=lambda b: (b[0] * b[1], b))
    area = width * height
    return next((b for b in same if b[0] * b[1] >= area), same[-1])


def bucket_batches(images: Sequence[Any], pre: Preprocess, buckets: Sequence[tuple[int, int]], *,
                   policy: str = "aspect-then-area") -> list[tuple[list[int], np.ndarray]]:
    """Preprocess each image at its bucket's size: [(indices into `images`, (b, C, H, W)
    batch), ...], one group per bucket used."""
    items = []
    for i, src in enumerate(images):
        image = load_image(src)
        hw = choose_bucket(*image.size, buckets, policy=policy)
        at = dataclasses.replace(pre, resolution=hw, resize="shorter_side_center_crop")
        items.append((i, at.array(image)))
    return group_by_shape(items)


# Which target's graphs a session on a provider uses when asked for target="auto".
PROVIDER_TARGETS = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "tensorrt",
    "TensorrtExecutionProvider": "tensorrt",
    "CoreMLExecutionProvider": "mobile",
    "NnapiExecutionProvider": "mobile",
    "XnnpackExecutionProvider": "mobile",
    "QNNExecutionProvider": "npu",
    "OpenVINOExecutionProvider": "npu",
    "WebGpuExecutionProvider": "web",
}


def resolve_target(manifest: Manifest | None, target: str | None, provider: str,
                   precision: str) -> TargetSpec | None:
    """The target whose bucket graphs a session uses: `target` by name (it must exist and
    hold `precision`), 'auto' (the provider's target if the bundle has it with this
    precision, else none), or None / 'none' (the dynamic graph only)."""
    if target in (None, "none") or manifest is None:
        return None
    if target == "auto":
        spec = manifest.targets.get(PROVIDER_TARGETS.get(provider, ""))
        return spec if spec is not None and precision in spec.precisions else None
    spec = manifest.target(target)
    if precision not in spec.precisions:
        raise BundleError(f"target {target!r} has no {precision!r} graphs; it has "
                          f"{list(spec.precisions)}")
    return spec


class BucketRunner:
    """Runs inputs of a bucket's size through that bucket's static graph.

    Sessions are made on first use (one per bucket, thread-safe). A batch larger than the
    graph's fixed batch runs in chunks; a short chunk is padded with zeros and the pad
    rows' outputs dropped (the graph keeps images independent; for batch-coupled dynamic
    int8 every image runs alone, zeros never widening the quantisation range, which always
    holds 0).
    """

    def __init__(self, root: Path, spec: TargetSpec, precision: str,
                 create: Callable[[Path], ort.InferenceSession], *, split: bool = False):
        self.root, self.spec, self.precision = Path(root), spec, precision
        self.resolutions = tuple(g.resolution for g in spec.graphs if g.precision == precision)
        self._create, self._split = create, split
        self._sessions: dict[tuple[int, int], ort.InferenceSession] = {}
        self._lock = threading.Lock()

    def covers(self, hw: tuple[int, int]) -> bool:
        return tuple(hw) in self.resolutions

    def path(self, hw: tuple[int, int]) -> Path:
        graph = self.spec.graph(self.precision, hw)
        if graph is None:
            raise BundleError(f"target {self.spec.name!r} has no {self.precision} graph at "
                              f"{hw[0]}x{hw[1]}; its buckets are {list(self.resolutions)}")
        return bundle_path(self.root, graph.file)  # refused if it leaves the bundle

    def session(self, hw: tuple[int, int]) -> ort.InferenceSession:
        hw = tuple(hw)
        with self._lock:
            if hw not in self._sessions:
                self._sessions[hw] = self._create(self.path(hw))
            return self._sessions[hw]

    def run(self, x: np.ndarray, input_name: str) -> dict[str, np.ndarray]:
        session = self.session(tuple(x.shape[2:]))
        names = [o.name for o in session.get_outputs()]
        step = 1 if self._split else self.spec.batch
        parts = []
        for i in range(0, len(x), step):
            chunk = x[i:i + step]
            n = len(chunk)
            if n < self.spec.batch:
                pad = np.zeros((self.spec.batch - n, *chunk.shape[1:]), np.float32)
                chunk = np.concatenate([chunk, pad])
            parts.append([o[:n] for o in session.run(None, {input_name: chunk})])
        return {name: np.concatenate([p[j] for p in parts]) for j, name in enumerate(names)}

    def batches(self, images: Sequence[Any], pre: Preprocess) -> list[tuple[list[int], np.ndarray]]:
        return bucket_batches(images, pre, self.resolutions, policy=self.spec.policy)
