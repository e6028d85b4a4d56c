"""Zero-shot labels for CLIP and SigLIP (`export --zero-shot LABELS`): the checkpoint's text
tower runs once, at export, on each label's prompt with the checkpoint's own tokenizer, and
the label embeddings become the bundle's classifier, so that the device classifies with the
user's words without a text tower, a tokenizer or torch.

The head is what transformers' zero-shot pipeline computes: logits = logit_scale.exp() x
cosine(image embedding, label embedding) + logit_bias (SigLIP; CLIP has none); probabilities
a softmax over the labels for CLIP, each label's sigmoid for SigLIP (the manifest's
purpose.probabilities). Prompts: the pipeline's template ("This is a photo of {}.") unless
given, tokenized as the pipeline does (SigLIP padded to 64 tokens, as it was trained).
Needs transformers (the checkpoint's tokenizer and text tower); nothing is downloaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.model import ViT

# transformers' ZeroShotImageClassificationPipeline: its default template and, for SigLIP,
# its tokenizer arguments and its sigmoid
TEMPLATE = "This is a photo of {}."
DUAL_ENCODERS = {"clip": "softmax", "siglip": "sigmoid", "siglip2": "sigmoid"}
SIGLIP_TOKENS = 64
MAX_LABELS = 100_000


@dataclass(frozen=True)
class ZeroShotHead:
    """The classifier a set of labels becomes: one row per label (its prompt's unit text
    embedding times the logit scale), a bias (SigLIP's logit_bias), how logits are read."""

    labels: tuple[str, ...]
    weight: torch.Tensor  # (labels, embedding width)
    bias: torch.Tensor  # (labels,)
    probabilities: str  # softmax | sigmoid
    template: str
    model_type: str
    logit_scale: float

    def record(self) -> dict[str, Any]:
        """What the manifest's export record says of it."""
        return {"labels": len(self.labels), "template": self.template,
                "model_type": self.model_type, "logit_scale": round(self.logit_scale, 6),
                "logit_bias": round(float(self.bias[0]), 6) if len(self.bias) else 0.0,
                "probabilities": self.probabilities}


def read_labels(path: Path, *, unique: bool = True) -> tuple[str, ...]:
    """One label per line (blank lines and surrounding spaces dropped); ValueError naming the
    file for none, more than MAX_LABELS, or (`unique`: zero-shot labels, each its own class)
    a repeated label. `export --labels` reads with unique=False: ImageNet's own class names
    repeat ("crane", "maillot")."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the labels {str(path)!r}: {e}") from None
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not labels:
        raise ValueError(f"{str(path)!r} holds no labels: expected one per line")
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{str(path)!r} holds {len(labels)} labels, at most {MAX_LABELS}")
    seen: set[str] = set()
    repeated = [x for x in labels if x in seen or seen.add(x)]  # type: ignore[func-returns-value]
    if unique and repeated:
        raise ValueError(f"{str(path)!r}: label {repeated[0]!r} appears more than once "
                         f"(each label must be its own class)")
    return labels


# the checkpoint's tensors a zero-shot head is made of (the text tower, its projection, the
# logit scale and bias): used at export, though no bundle output holds them
TEXT_TOWER = ("text_model.", "text_projection.", "logit_scale", "logit_bias")


def uses_tensor(name: str) -> bool:
    """Whether `zero_shot_head` reads the checkpoint tensor `name`."""
    return any(name.startswith(t) for t in TEXT_TOWER)


def check_template(template: str) -> str:
    """A prompt template with exactly one `{}` (where the label goes)."""
    if template.count("{}") != 1 or template.replace("{}", "").count("{") \
            or template.replace("{}", "").count("}"):
        raise ValueError(f"--prompt must hold exactly one {{}} where the label goes (and no "
                         f"other braces), got {template!r}")
    return template


def zero_shot_head(directory: Path, labels: tuple[str, ...], template: str | None = None
                   ) -> ZeroShotHead:
    """The label embeddings of a CLIP / SigLIP checkpoint folder (config.json's model_type
    clip, siglip or siglip2: the whole model, text tower included, and its tokenizer)."""
    import json

    directory = Path(directory)
    template = check_template(template or TEMPLATE)
    try:
        model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"--zero-shot: cannot read {str(directory / 'config.json')!r}: "
                              f"{e}") from None
    if model_type not in DUAL_ENCODERS:
        raise CheckpointError(
            f"--zero-shot needs a checkpoint with its text tower (CLIPModel, SiglipModel or "
            f"Siglip2Model: config.json model_type one of {sorted(DUAL_ENCODERS)}), got "
            f"model_type {model_type!r} in {str(directory)!r}")
    try:
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        raise CheckpointError("--zero-shot runs the checkpoint's text tower with transformers, "
                              "which is not installed: pip install transformers") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its "Loading weights" bar is not our progress line
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        model = AutoModel.from_pretrained(directory, local_files_only=True).eval()
    except (OSError, ValueError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"--zero-shot: cannot load the text tower or the tokenizer of "
                              f"{str(directory)!r}: {first}") from None
    sigmoid = DUAL_ENCODERS[model_type] == "sigmoid"
    args = (dict(padding="max_length", max_length=SIGLIP_TOKENS, truncation=True) if sigmoid
            else dict(padding=True, truncation=True))
    rows = []
    with torch.inference_mode():
        for start in range(0, len(labels), 256):
            prompts = [template.format(x) for x in labels[start:start + 256]]
            tokens = tokenizer(prompts, return_tensors="pt", **args)
            text = model.get_text_features(**tokens)
            rows.append((text if isinstance(text, torch.Tensor) else text.pooler_output).float())
        text = torch.cat(rows)
        text = text / text.norm(dim=-1, keepdim=True)
        scale = float(model.logit_scale.exp())
        bias = float(model.logit_bias) if getattr(model, "logit_bias", None) is not None else 0.0
    return ZeroShotHead(labels=labels, weight=(text * scale).contiguous(),
                        bias=torch.full((len(labels),), bias), probabilities=DUAL_ENCODERS[
                            model_type], template=template, model_type=model_type,
                        logit_scale=scale)


def with_zero_shot(vit: ViT, head: ZeroShotHead) -> ViT:
    """`vit` with `head` as its classifier (config head_norm: the pooled vector, CLIP's
    projection included, scaled to unit length first)."""
    cfg = vit.cfg
    if cfg.num_classes:
        raise CheckpointError(f"--zero-shot: the checkpoint already classifies "
                              f"({cfg.num_classes} classes); zero-shot labels need an image "
                              f"tower without a classifier")
    if head.weight.shape[1] != cfg.pooled_dim:
        raise CheckpointError(f"--zero-shot: the text embeddings are {head.weight.shape[1]} "
                              f"wide, the image embedding {cfg.pooled_dim}: not one model's "
                              f"towers")
    out = ViT(cfg.replace(num_classes=len(head.labels), head_norm=True)).eval()
    state = dict(vit.state_dict())
    state["head.weight"], state["head.bias"] = head.weight, head.bias
    out.load_state_dict(state)
    return out
