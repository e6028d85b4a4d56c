"""Images in, vectors out: which output of a bundle is its embedding, and the vectors of
images (ViTSession.embed). A backbone (DINOv2, CLIP and SigLIP image towers) has no
classifier: asked to classify, it says so and names embed(). Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from vit_deploy.runtime.contract import FEATURES_NAME, LOGITS_NAME
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.purpose import Purpose
from vit_deploy.runtime.results import require_finite

if TYPE_CHECKING:
    from vit_deploy.runtime.preprocess import ImageInput, Preprocess

def purpose_of(session: Any) -> Purpose:
    """A session's purpose: its manifest's, or (a bare .onnx file) read from its outputs."""
    manifest = getattr(session, "manifest", None)
    purpose = getattr(manifest, "purpose", None)
    return purpose if purpose is not None else Purpose.of_outputs(session.output_names)


def embedding_output(session: Any) -> str | None:
    """The output that embeds an image (the manifest's purpose says; None: none does)."""
    return purpose_of(session).embedding


def not_a_classifier(session: Any) -> BundleError | None:
    """The error for classifying with a model that does not classify (a backbone: its
    purpose has no classifier), or None when it does."""
    purpose = purpose_of(session)
    if purpose.classifier is not None:
        return None
    use = purpose.embedding
    path = str(getattr(session, "model_path", "the model"))
    return BundleError(f"{path!r} has no {LOGITS_NAME!r} output to classify with (outputs: "
                       f"{list(session.output_names)}): a backbone without a classifier; "
                       + (f"use embed() for its {use!r} vectors (`vit-deploy embed`, POST "
                          f"/embed)" if use else "use features() or run_all()"))


def normalised(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length (cosine similarity becomes a dot product)."""
    v = vectors.astype(np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def embed_images(session: Any, images: Sequence[ImageInput], *, normalize: bool = True,
                 output: str | None = None, preprocess: Preprocess | None = None
                 ) -> np.ndarray:
    """(N, D) float32: one vector per image of the list, in its order, from `output` (by default
    the bundle's embedding output), unit length with `normalize`. Images are prepared by
    `preprocess` (by default the manifest's: resized and centre-cropped to the deploy size;
    Preprocess(resolution=...) for another size the bundle takes); same-size ones share a
    batch."""
    name = output or embedding_output(session)
    if name is None or name not in session.output_names:
        raise BundleError(f"{str(session.model_path)!r} has no "
                          f"{'one-vector-per-image output' if name is None else repr(name)} to "
                          f"embed with (outputs: {session.output_names}); export with "
                          f"--outputs {FEATURES_NAME} (a classifier may add it: "
                          f"--outputs logits,{FEATURES_NAME})")
    pre = session._guarded(preprocess or session.preprocess())
    out: list[np.ndarray | None] = [None] * len(images)
    for indices, batch in pre.batches(images):
        vectors = require_finite(session.run_all(batch)[name], name)
        if vectors.ndim != 2:
            raise BundleError(f"{str(session.model_path)!r}: output {name!r} has shape "
                              f"{list(vectors.shape)}; an embedding is (batch, width)")
        for i, v in zip(indices, normalised(vectors) if normalize else vectors):
            out[i] = v
    width = len(out[0]) if out else 0
    return np.stack(out) if out else np.zeros((0, width), np.float32)
