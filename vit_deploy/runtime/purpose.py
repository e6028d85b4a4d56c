"""What a bundle is for: it classifies (a logits output, labels where the checkpoint has
them), embeds (one vector per image: which output, its width, whether it comes out unit
length, the similarity it is searched with), or both. The manifest's `purpose`, written by
export from the model it exported; every consumer (ViTSession.classify / embed, the servers'
/predict and /embed, the web page, Node) reads it from there. A bundle written before the
field, or a bare .onnx file, has its purpose read from its output names. Torch-free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vit_deploy.runtime.contract import (CLASS_TOKEN_NAME, FEATURES_NAME, LAYER_PREFIX,
                                         LOGITS_NAME, OUTPUT_KINDS)
from vit_deploy.runtime.manifest_parts import BundleError, TensorSpec

# The outputs that are one vector per image, best first: the pooled output (the class
# token, a mean over the tokens or a MAP head, and CLIP's projection), else the class token
EMBEDDING_OUTPUTS = (FEATURES_NAME, CLASS_TOKEN_NAME)
# cosine: compare unit-length vectors (DINOv2, CLIP and SigLIP are trained and searched so);
# dot: the raw inner product (a model trained for it)
SIMILARITIES = ("cosine", "dot")
# How a classifier's logits become probabilities: softmax over the classes (one label per
# image), or sigmoid of each (SigLIP's zero-shot head: each label judged on its own)
PROBABILITIES = ("softmax", "sigmoid")
KINDS = ("classifier", "embedding", "classifier+embedding", "features")


@dataclass(frozen=True, kw_only=True)
class Purpose:
    classifier: str | None = None  # the output that classifies, None: the model does not
    embedding: str | None = None  # the output that embeds an image, None: none does
    dim: int | None = None  # the embedding's width, where the graph fixes it
    normalised: bool = False  # the output itself is unit length (ours are not: embed() scales)
    similarity: str = "cosine"
    probabilities: str = "softmax"  # PROBABILITIES: how the classifier's logits are read

    @property
    def kind(self) -> str:
        if self.classifier and self.embedding:
            return "classifier+embedding"
        return "classifier" if self.classifier else "embedding" if self.embedding else "features"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "classifier": self.classifier,
                **({"probabilities": self.probabilities}
                   if self.probabilities != "softmax" else {}),
                "embedding": None if self.embedding is None else {
                    "output": self.embedding, "dim": self.dim, "normalised": self.normalised,
                    "similarity": self.similarity}}

    @classmethod
    def of_outputs(cls, outputs: Sequence[TensorSpec | str]) -> Purpose:
        """What outputs named and shaped so are for: `logits` classifies (and so does a
        model whose outputs have names of their own: its first); `pooled`, else
        `class_token`, embeds."""
        names = [o if isinstance(o, str) else o.name for o in outputs]
        classifier = (LOGITS_NAME if LOGITS_NAME in names
                      else names[0] if names and not all(_ours(n) for n in names)
                      else None)
        embedding = next((n for n in EMBEDDING_OUTPUTS if n in names), None)
        dim = None
        for o in outputs:
            if not isinstance(o, str) and o.name == embedding and len(o.shape) == 2 \
                    and isinstance(o.shape[1], int):
                dim = o.shape[1]
        return cls(classifier=classifier, embedding=embedding, dim=dim)


def _ours(name: str) -> bool:
    """An output kind vit-deploy exports (layer_N: the patch tokens after block N)."""
    return name in OUTPUT_KINDS or (name.startswith(LAYER_PREFIX)
                                    and name[len(LAYER_PREFIX):].isdigit())


def parse_purpose(value: Any, outputs: Sequence[TensorSpec], where: str) -> Purpose:
    """The manifest's `purpose` (absent: read from the outputs), checked against the
    outputs the bundle declares: each named output exists, the embedding is (batch, dim)."""
    if value is None:
        return Purpose.of_outputs(outputs)
    shapes = {o.name: o.shape for o in outputs}

    def bad(field_: str, expected: str, got: Any) -> BundleError:
        return BundleError(f"{where}: purpose.{field_} must be {expected}, got {repr(got)[:60]}")

    if not isinstance(value, Mapping):
        raise bad("", "an object", value)
    classifier = value.get("classifier")
    if classifier is not None and (not isinstance(classifier, str) or classifier not in shapes):
        raise bad("classifier", f"null or one of the outputs {list(shapes)}", classifier)
    probabilities = value.get("probabilities", "softmax")
    if probabilities not in PROBABILITIES or (probabilities != "softmax" and classifier is None):
        raise bad("probabilities", f"one of {list(PROBABILITIES)} (with a classifier)",
                  probabilities)
    emb = value.get("embedding")
    if emb is None:
        return Purpose(classifier=classifier, probabilities=probabilities)
    if not isinstance(emb, Mapping):
        raise bad("embedding", "null or an object", emb)
    name, dim = emb.get("output"), emb.get("dim")
    if not isinstance(name, str) or name not in shapes or len(shapes[name]) != 2:
        raise bad("embedding.output", f"one of the (batch, width) outputs "
                  f"{[n for n, s in shapes.items() if len(s) == 2]}", name)
    width = shapes[name][1]
    if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool)
                            or (isinstance(width, int) and dim != width)):
        raise bad("embedding.dim", f"null or the output's width {width}", dim)
    normalised, similarity = emb.get("normalised", False), emb.get("similarity", "cosine")
    if not isinstance(normalised, bool):
        raise bad("embedding.normalised", "true or false", normalised)
    if similarity not in SIMILARITIES:
        raise bad("embedding.similarity", f"one of {list(SIMILARITIES)}", similarity)
    return Purpose(classifier=classifier, embedding=name, dim=dim, normalised=normalised,
                   similarity=similarity, probabilities=probabilities)
