"""TensorRT provider options built from a bundle, checked as data (no GPU needed)."""

import dataclasses
from pathlib import Path

import pytest

from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.manifest_parts import BucketGraph, TargetSpec
from vit_deploy.runtime.providers import Provider, parse_providers
from vit_deploy.runtime.tensorrt import (Profile, cache_key, dynamic_profile, static_profile,
                                         tensorrt_defaults, tensorrt_options)

PROFILE = static_profile(1, 3, (224, 224))


def test_fp16_keeps_layernorm_in_fp32_and_caches_live_in_the_bundle(tmp_path):
    o = tensorrt_options(tmp_path, "fp16", PROFILE, gpu="NVIDIA H100 80GB HBM3", trt_version="10.3.0")
    assert o["trt_fp16_enable"] is True and o["trt_layer_norm_fp32_fallback"] is True
    assert o["trt_int8_enable"] is False
    assert o["trt_engine_cache_enable"] is True and o["trt_timing_cache_enable"] is True
    cache = Path(o["trt_engine_cache_path"])
    assert cache.parent == tmp_path / ".ort-cache" / "tensorrt"
    assert o["trt_timing_cache_path"] == o["trt_engine_cache_path"]
    assert cache.name.startswith("NVIDIA-H100-80GB-HBM3-trt10.3.0-fp16-")
    assert o["trt_profile_min_shapes"] == o["trt_profile_max_shapes"] == "pixel_values:1x3x224x224"
    fp32 = tensorrt_options(tmp_path, "fp32", PROFILE, gpu="g", trt_version="10")
    assert fp32["trt_fp16_enable"] is False and fp32["trt_layer_norm_fp32_fallback"] is False
    assert tensorrt_options(tmp_path, "int8-static", PROFILE, gpu="g", trt_version="10")[
        "trt_int8_enable"] is True


def test_a_cache_is_never_shared_across_gpu_version_precision_or_profile():
    base = ("A100", "10.3", "fp16", PROFILE)
    keys = {cache_key(*base),
            cache_key("H100", "10.3", "fp16", PROFILE),
            cache_key("A100", "10.4", "fp16", PROFILE),
            cache_key("A100", "10.3", "fp32", PROFILE),
            cache_key("A100", "10.3", "fp16", static_profile(1, 3, (448, 448))),
            cache_key("A100", "10.3", "fp16", static_profile(2, 3, (224, 224)))}
    assert len(keys) == 6
    assert cache_key(*base) == cache_key(*base)


def test_precisions_tensorrt_cannot_run_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not 'int8'"):
        tensorrt_options(tmp_path, "int8", PROFILE, gpu="g", trt_version="1")
    with pytest.raises(ValueError, match="min <= opt <= max"):
        Profile((1, 3, 64, 64), (1, 3, 32, 32), (1, 3, 64, 64))


def test_profiles_come_from_the_declared_range_and_the_buckets(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    m = load_manifest(result.path)
    p = dynamic_profile(m, max_batch=4)
    hw = [m.deploy_resolution, m.native_resolution]
    assert p.min == (1, 3, min(h for h, _ in hw), min(w for _, w in hw))
    assert p.opt == (1, 3, *m.deploy_resolution)
    assert p.max == (4, 3, max(h for h, _ in hw), max(w for _, w in hw))
    spec = TargetSpec(name="tensorrt", batch=1, policy="aspect-then-area", graphs=(
        BucketGraph(resolution=(16, 80), batch=1, precision="fp32", file="model.onnx"),))
    wide = dynamic_profile(dataclasses.replace(m, targets={"tensorrt": spec}), max_batch=4)
    assert wide.min[2] == 16 and wide.max[3] == 80
    # the session fills in options only for a TensorRT provider asked for without any
    asked = parse_providers("tensorrt,cuda,cpu")
    filled = tensorrt_defaults(asked, result.path, m, "fp16")
    assert filled[0].options["trt_fp16_enable"] is True
    assert filled[0].options["trt_profile_opt_shapes"] == "pixel_values:1x3x{}x{}".format(
        *m.deploy_resolution)
    assert filled[1:] == asked[1:]
    mine = [Provider("TensorrtExecutionProvider", {"trt_fp16_enable": False})]
    assert tensorrt_defaults(mine, result.path, m, "fp16") == mine
    assert tensorrt_defaults(parse_providers("cpu"), result.path, m, "fp32") == \
        parse_providers("cpu")
