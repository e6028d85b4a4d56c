"""Checkpoints: our safetensors (config in the header), timm state dicts, Hugging Face directories.

Pickles are loaded only with weights_only. Each foreign loader maps keys onto our layout
and sets the config from the source, including how the source resamples position
embeddings (timm: bicubic with antialias; Hugging Face ViT, DeiT, DINOv2: bicubic without;
DINOv2 with registers: with), so the exported graph gives the source framework's outputs
at any resolution.

A checkpoint may lie: its config may disagree with its weights, or its tensors with each
other. Every loader compares what the config says with what the tensors hold before it
builds anything, and refuses a disagreement with a message that names both sides. Every
tensor in the file is used or reported: unused ones are an error, except those known not
to matter to the forward pass (a Hugging Face pooler, a mask token), which are a
CheckpointWarning.

The package: one module per family (timm, hf_vit, dinov2, clip, siglip, dinov3: a key map
and the family's config fields), the readers they share (encoder: ViTModel-style
directories; tower: image towers; mapping: their keys onto ours), our own layout checked
(layout), the files (files, hf_config), the metadata key (metadata), and the entry points
(entry). Everything public is importable from here.
"""

from vit_deploy.export.checkpoints.clip import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from vit_deploy.export.checkpoints.encoder import HF_PREFIXES
from vit_deploy.export.checkpoints.entry import (FORMATS, load_any, load_model,
                                                 model_from_state, save_weights)
from vit_deploy.export.checkpoints.errors import CheckpointError, CheckpointWarning
from vit_deploy.export.checkpoints.files import (_read_json, not_a_file, read_state_dict,
                                                 require_file)
from vit_deploy.export.checkpoints.hf import (FAMILIES, HF_TYPES, TOWER_NORMALISATION,
                                              TOWER_TYPES, load_hf)
from vit_deploy.export.checkpoints.layout import load_state
from vit_deploy.export.checkpoints.mapping import HF_IRRELEVANT
from vit_deploy.export.checkpoints.metadata import CONFIG_KEY
from vit_deploy.export.checkpoints.timm import HEADS_BY_WIDTH, load_timm, timm_config
from vit_deploy.export.checkpoints.tower import TOWER_ACTS

__all__ = [
    "CONFIG_KEY", "FAMILIES", "FORMATS", "HEADS_BY_WIDTH", "HF_IRRELEVANT", "HF_PREFIXES",
    "HF_TYPES", "OPENAI_CLIP_MEAN", "OPENAI_CLIP_STD", "TOWER_ACTS", "TOWER_NORMALISATION",
    "TOWER_TYPES", "CheckpointError", "CheckpointWarning", "load_any", "load_hf", "load_model",
    "load_state", "load_timm", "model_from_state", "not_a_file", "read_state_dict",
    "require_file", "save_weights", "timm_config",
]
# _read_json: sources.py reads preprocessor_config.json with it.
