import pytest

from vit_deploy.runtime.config import VARIANTS, ViTConfig, parse_variant, variant


@pytest.mark.parametrize("name,width,depth,heads", [
    ("Ti", 192, 12, 3), ("S", 384, 12, 6), ("B", 768, 12, 12), ("L", 1024, 24, 16)])
@pytest.mark.parametrize("patch", [8, 14, 16, 32])
def test_named_variants(name, width, depth, heads, patch):
    cfg = variant(f"{name}/{patch}")
    assert (cfg.width, cfg.depth, cfg.heads, cfg.mlp_ratio) == (width, depth, heads, 4.0)
    assert cfg.patch_size == patch
    assert cfg.grid_size == (224 // patch, 224 // patch)
    assert cfg.name == f"{name}/{patch}"


def test_tiny_is_small_and_default_patch_is_16():
    assert variant("tiny").width <= 64 and variant("tiny").depth <= 2
    assert variant("B").patch_size == 16


def test_json_round_trip():
    cfg = variant("S/14", pos_embed="factorized", pool="mean", img_size=(224, 280),
                  pos_antialias=True, num_classes=7)
    again = ViTConfig.from_json(cfg.to_json())
    assert again == cfg
    assert again.img_size == (224, 280) and isinstance(again.img_size, tuple)


@pytest.mark.parametrize("kwargs,match", [
    (dict(width=100, heads=3), "not divisible by heads"),
    (dict(img_size=(224, 230)), "multiples of patch_size"),
    (dict(pos_embed="sinusoidal"), "pos_embed must be one of"),
    (dict(pool="max"), "pool must be one of"),
    (dict(pool="cls", class_token=False), "needs class_token"),
])
def test_invalid_configs_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(**kwargs)


def test_unknown_variant_lists_known_ones():
    with pytest.raises(ValueError, match="known: " + ", ".join(VARIANTS)):
        parse_variant("XL/16")


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown ViTConfig keys"):
        ViTConfig.from_dict({"width": 64, "colour": "red"})
