"""What a config.json that leaves a field out means: transformers builds the model with its
configuration class's default, so the loader must read the same value. Published configs
rely on it (a dual encoder's vision_config may name little more than its model_type).

One row per model_type the loader reads (the fields it reads; the values are the defaults of
transformers' CLIPVisionConfig, SiglipVisionConfig, Siglip2VisionConfig, DINOv3ViTConfig,
ViTConfig, DeiTConfig, Dinov2Config, Dinov2WithRegistersConfig). The suite compares every
value with the installed transformers (tests/export/test_published.py)."""

from __future__ import annotations

from typing import Any

_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_channels=3,
             image_size=224)
_ENCODER = dict(_BASE, intermediate_size=3072, patch_size=16, hidden_act="gelu",
                layer_norm_eps=1e-12, qkv_bias=True)
_DINOV2 = dict(_BASE, hidden_act="gelu", layer_norm_eps=1e-6, mlp_ratio=4, qkv_bias=True,
               use_swiglu_ffn=False)
_SIGLIP = dict(_BASE, intermediate_size=3072, patch_size=16, hidden_act="gelu_pytorch_tanh",
               layer_norm_eps=1e-6)

CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "vit": _ENCODER,
    "deit": _ENCODER,
    "dinov2": dict(_DINOV2, patch_size=14),
    "dinov2_with_registers": dict(_DINOV2, patch_size=16, num_register_tokens=4),
    "clip_vision_model": dict(_BASE, intermediate_size=3072, patch_size=32,
                              hidden_act="quick_gelu", layer_norm_eps=1e-5),
    "siglip_vision_model": _SIGLIP,
    "siglip2_vision_model": {**{k: v for k, v in _SIGLIP.items() if k != "image_size"},
                             "num_patches": 256},
    "dinov3_vit": dict(_BASE, hidden_size=384, intermediate_size=1536, num_attention_heads=6,
                       patch_size=16, hidden_act="gelu", layer_norm_eps=1e-5,
                       num_register_tokens=0, use_gated_mlp=False, rope_theta=100.0),
}

# Dual encoders (CLIPModel, SiglipModel, Siglip2Model), the form the hub's CLIP and SigLIP
# repositories publish: config.json nests the image tower's config under vision_config (its
# model_type below), its tensors sit under vision_model. beside the text tower's.
DUAL_ENCODERS = {"clip": "clip_vision_model", "siglip": "siglip_vision_model",
                 "siglip2": "siglip2_vision_model"}


def with_defaults(model_type: str, config: dict[str, Any]) -> dict[str, Any]:
    """config.json's fields over transformers' defaults for its model_type."""
    return {**CONFIG_DEFAULTS.get(model_type, {}), **config}


# preprocessor_config.json read the same way: each image processor class's own defaults for
# the fields a file may leave out (transformers' ViT, DeiT, BiT (DINOv2), CLIP, SigLIP,
# SigLIP 2, DINOv3 image processors), and the classes to which a bare integer `size` N means the shortest
# edge, aspect kept (to the others: N x N).
_HALF = [0.5, 0.5, 0.5]
_CLIP = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])
_IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
_SQUARE_224 = {"height": 224, "width": 224}
_SHORT_224 = dict(resample=3, size={"shortest_edge": 224}, crop_size=_SQUARE_224,
                  do_center_crop=True, image_mean=_CLIP[0], image_std=_CLIP[1])
INT_SIZE_IS_SHORTEST_EDGE = frozenset({"BitImageProcessor", "CLIPImageProcessor",
                                       "SiglipImageProcessor"})
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "ViTImageProcessor": dict(resample=2, size=_SQUARE_224, image_mean=_HALF,
                              image_std=_HALF),
    "DeiTImageProcessor": dict(resample=3, size={"height": 256, "width": 256},
                               crop_size=_SQUARE_224, do_center_crop=True,
                               image_mean=_HALF, image_std=_HALF),
    "BitImageProcessor": _SHORT_224,
    "CLIPImageProcessor": _SHORT_224,
    "SiglipImageProcessor": dict(resample=3, size=_SQUARE_224, image_mean=_HALF,
                                 image_std=_HALF),
    "Siglip2ImageProcessor": dict(resample=2, image_mean=_HALF, image_std=_HALF,
                                  max_num_patches=256, patch_size=16),
    "DINOv3ViTImageProcessor": dict(resample=2, size=_SQUARE_224,
                                    image_mean=_IMAGENET[0], image_std=_IMAGENET[1]),
}


# The processor transformers picks for a model_type when preprocessor_config.json names none
# (its image_processing_auto mapping).
PROCESSOR_OF_MODEL = {"vit": "ViTImageProcessor", "deit": "DeiTImageProcessor",
                      "dinov2": "BitImageProcessor", "clip": "CLIPImageProcessor",
                      "siglip": "SiglipImageProcessor", "siglip2": "Siglip2ImageProcessor",
                      "dinov3_vit": "DINOv3ViTImageProcessor"}


def processor_class(data: dict[str, Any], model_type: object = None) -> str | None:
    """The image processor class a preprocessor_config.json names (image_processor_type, or
    an older feature_extractor_type), without its backend suffix (Fast, Pil); where it names
    none, the one transformers picks for config.json's model_type."""
    name = data.get("image_processor_type") or data.get("feature_extractor_type")
    if not isinstance(name, str):
        return PROCESSOR_OF_MODEL.get(model_type) if isinstance(model_type, str) else None
    name = name.replace("FeatureExtractor", "ImageProcessor")
    for suffix in ("Fast", "Pil"):
        name = name.removesuffix(suffix)
    return name


def processor_with_defaults(data: dict[str, Any], model_type: object = None) -> dict[str, Any]:
    """preprocessor_config.json's fields over its processor class's defaults (none for a
    class not in the table: then what the file says is all there is)."""
    return {**PROCESSOR_DEFAULTS.get(processor_class(data, model_type) or "", {}), **data}
