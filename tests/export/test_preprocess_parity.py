"""Our pixel tensors against the checkpoint library's own image processor.

transformers' processors run here (their PIL backend: torchvision cannot load beside this
torch), saved with save_pretrained and mapped to the manifest by export/sources.py; the
bound is 1/255 per pixel after the normalisation is undone. timm's transform is not
importable here (it needs torchvision): its pretrained_cfg mapping is tested against timm's
documented rule (transforms_imagenet_eval: shorter side to floor(input_size / crop_pct),
centre crop input_size; squash: both sides).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import transformers
from pixels import SIZES, photo
from vit_deploy.export.sources import hf_preprocess, timm_preprocess
from vit_deploy.runtime.preprocess import Preprocess, resized_size

PROCESSORS = {  # name -> the processor as its model ships it
    "ViT (size 224x224, bilinear)": lambda: transformers.ViTImageProcessorPil(),
    "DeiT (256x256, crop 224, bicubic)": lambda: transformers.DeiTImageProcessorPil(),
    "DINOv2 / BiT (shortest_edge 256, crop 224, bicubic)": lambda: transformers.BitImageProcessorPil(
        size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}),
    "CLIP (shortest_edge 224, crop 224, bicubic)": lambda: transformers.CLIPImageProcessorPil(),
    "ViT nearest 160x160": lambda: transformers.ViTImageProcessorPil(
        size={"height": 160, "width": 160}, resample=0),
    "BiT lanczos (shortest_edge 248, crop 224)": lambda: transformers.BitImageProcessorPil(
        size={"shortest_edge": 248}, crop_size={"height": 224, "width": 224}, resample=1),
}


def _saved_and_ours(make):
    with tempfile.TemporaryDirectory() as d:
        make().save_pretrained(d)
        theirs = transformers.AutoImageProcessor.from_pretrained(d)
        src = hf_preprocess(__import__("json").loads(
            Path(d, "preprocessor_config.json").read_text()), Path(d))
    ours = Preprocess(resolution=src.size, patch_size=1, mean=src.mean, std=src.std,
                      resize=src.resize, interpolation=src.interpolation, scale=src.scale,
                      crop_pct=src.crop_pct)
    return theirs, ours


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_our_tensors_match_transformers_image_processor(name):
    theirs, ours = _saved_and_ours(PROCESSORS[name])
    step = np.asarray(ours.std, np.float32)[:, None, None] / np.float32(ours.scale)
    worst = 0.0
    for w, h in SIZES:
        image = photo(w, h)
        want = theirs(image, return_tensors="np")["pixel_values"][0]
        got = ours(image)
        assert got.shape == want.shape, (name, (w, h), got.shape, want.shape)
        worst = max(worst, float((np.abs(got - want) * step).max()))  # in 8-bit steps
    # The same Pillow resize, crop offsets and float32 arithmetic: equal but for rounding
    # of the normalisation (transformers rescales in float64, then normalises in float32).
    assert worst <= 1e-3, f"{name}: {worst} of 1/255"


@pytest.mark.parametrize("crop_pct,mode,size", [(0.9, "center", 224), (0.875, "center", 224),
                                                (1.0, "center", 384), (0.95, "squash", 224),
                                                (0.96, "center", 160)])
def test_timm_pretrained_cfg_follows_timms_documented_rule(crop_pct, mode, size):
    cfg = {"input_size": [3, size, size], "interpolation": "bicubic", "crop_pct": crop_pct,
           "crop_mode": mode, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
    src = timm_preprocess(cfg, Path("config.json"))
    pre = src.spec((size, size))
    scale = math.floor(size / crop_pct)  # timm: scale_size = floor(img_size / crop_pct)
    for w, h in SIZES:
        if mode == "squash":  # transforms.Resize((scale, scale)), then CenterCrop
            want = (scale, scale)
        else:  # transforms.Resize(scale): the shorter side, the longer int(scale * long / short)
            want = (int(scale * h / w), scale) if w <= h else (scale, int(scale * w / h))
        assert resized_size(pre.resize, pre.crop_pct, pre.resolution, w, h) == want
        ours = Preprocess(resolution=pre.resolution, patch_size=16, mean=pre.mean, std=pre.std,
                          resize=pre.resize, interpolation=pre.interpolation,
                          crop_pct=pre.crop_pct)
        image = photo(w, h)
        resized = image.resize(want[::-1], Image.Resampling.BICUBIC)
        # torchvision's CenterCrop rounds the offset, (side - crop) / 2, half to even; we
        # (and transformers) floor it: the same pixels unless that difference is odd
        top, left = (round((want[0] - size) / 2), round((want[1] - size) / 2))
        ref = np.asarray(resized.crop((left, top, left + size, top + size)), np.float32)
        ref = ((ref / 255 - 0.5) / 0.5).transpose(2, 0, 1)
        if (want[0] - size) % 2 == 0 and (want[1] - size) % 2 == 0:
            np.testing.assert_allclose(ours(image), ref, atol=1e-5)
