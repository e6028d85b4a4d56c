"""Hugging Face directories: config.json's model_type says which family reads it (FAMILIES,
the registry); load_hf hands the directory to that family's reader."""

from __future__ import annotations

from pathlib import Path

from vit_deploy.export.checkpoints.clip import FAMILY as CLIP
from vit_deploy.export.checkpoints.defaults import DUAL_ENCODERS, with_defaults
from vit_deploy.export.checkpoints.dinov2 import FAMILY as DINOV2
from vit_deploy.export.checkpoints.dinov3 import FAMILY as DINOV3
from vit_deploy.export.checkpoints.errors import CheckpointError
from vit_deploy.export.checkpoints.family import Family
from vit_deploy.export.checkpoints.files import _read_json, not_a_file, require_file
from vit_deploy.export.checkpoints.hf_vit import FAMILY as VIT
from vit_deploy.export.checkpoints.siglip import FAMILY as SIGLIP, FAMILY2 as SIGLIP2
from vit_deploy.export.checkpoints.tower import load_tower
from vit_deploy.export.model import ViT

# Every family a Hugging Face directory may be: a new one is a module and a line here.
FAMILIES: tuple[Family, ...] = (VIT, DINOV2, CLIP, SIGLIP, SIGLIP2, DINOV3)
# The model_types of ViTModel-style encoders (encoder.load_encoder) and of the image towers
# of CLIP, SigLIP, SigLIP 2 and DINOv3 (tower.load_tower); the normalisation each tower's
# processor uses when the directory carries none.
HF_TYPES = {t for f in FAMILIES if f.loader is not load_tower for t in f.model_types}
TOWER_TYPES = {t for f in FAMILIES if f.loader is load_tower for t in f.model_types}
TOWER_NORMALISATION = {t: f.normalisation for f in FAMILIES if f.loader is load_tower
                       for t in f.model_types}


def family_of(model_type: object) -> Family | None:
    """The family that reads config.json's `model_type`, None when none does."""
    return next((f for f in FAMILIES if f.detects(model_type)), None)


def load_hf(directory: Path) -> ViT:
    """ViT / DeiT / Dinov2 / Dinov2WithRegisters, with or without a classification head;
    the image towers of CLIP (± projection), SigLIP, SigLIP 2 and DINOv3."""
    directory = Path(directory)
    where = str(directory)
    config_path = directory / "config.json"
    if not_a_file(config_path) == "missing":
        raise CheckpointError(f"{where!r} has no config.json: not a Hugging Face "
                              f"checkpoint directory")
    require_file(config_path, "Hugging Face config")
    hf = _read_json(config_path)
    kind = hf.get("model_type")
    if isinstance(kind, str) and kind in DUAL_ENCODERS:
        kind, hf = _vision_config(hf, kind, config_path)
    family = family_of(kind)
    if family is None:
        raise CheckpointError(f"Hugging Face model_type {kind!r} is not supported; supported: "
                              f"{sorted(HF_TYPES | TOWER_TYPES | set(DUAL_ENCODERS))}")
    return family.loader(directory, kind, with_defaults(kind, hf), family)


def _vision_config(hf: dict, kind: str, config_path: Path) -> tuple[str, dict]:
    """A dual encoder's image tower: its vision_config (absent: every field the default),
    whose model_type, when given, must be the tower's."""
    tower = DUAL_ENCODERS[kind]
    vision = hf.get("vision_config", {})
    if vision is None:
        vision = {}
    if not isinstance(vision, dict):
        raise CheckpointError(f"{str(config_path)!r}: vision_config must be an object, got "
                              f"{repr(vision)[:40]}")
    if vision.get("model_type", tower) != tower:
        raise CheckpointError(f"{str(config_path)!r}: a {kind!r} model's vision_config must "
                              f"have model_type {tower!r}, got {vision['model_type']!r}")
    return tower, {**vision, "model_type": tower}
