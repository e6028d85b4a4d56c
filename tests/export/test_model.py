import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import tiny
from vit_deploy.config import variant
from vit_deploy.export.model import Attention, PatchEmbed, build_model, resample_pos_embed


def test_patchify_raster_order():
    # A 4x4 single-channel image 0..15 with 2x2 patches: patches in raster order, and
    # each patch's pixels in raster order.
    cfg = variant("tiny", in_chans=1, patch_size=2, img_size=(4, 4), mean=(0.5,), std=(0.5,),
                  width=4, heads=1)
    embed = PatchEmbed(cfg)
    with torch.no_grad():  # the conv picks pixel k of the patch into channel k
        embed.proj.weight.zero_()
        embed.proj.bias.zero_()
        for k in range(4):
            embed.proj.weight[k, 0, k // 2, k % 2] = 1.0
    image = torch.arange(16.0).reshape(1, 1, 4, 4)
    tokens = embed(image)  # (1, 4, 4)
    assert tokens[0].tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]


def test_patch_conv_equals_linear_map_on_flattened_patches():
    torch.manual_seed(0)
    P, D, B = 16, 64, 2
    embed = PatchEmbed(variant("tiny", patch_size=P, width=D, heads=4, img_size=(224, 224)))
    x = torch.randn(B, 3, 224, 224)
    patches = x.unfold(2, P, P).unfold(3, P, P)  # (B, C, 14, 14, P, P)
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(B, 196, 3 * P * P)
    linear = nn.Linear(3 * P * P, D)
    linear.weight.data = embed.proj.weight.data.reshape(D, -1)
    linear.bias.data = embed.proj.bias.data
    with torch.no_grad():
        torch.testing.assert_close(linear(patches), embed(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("res,patches", [(224, 196), (448, 784)])
@pytest.mark.parametrize("class_token", [True, False])
def test_token_counts(res, patches, class_token):
    cfg = variant("tiny", patch_size=16, img_size=(224, 224), class_token=class_token,
                  pool="cls" if class_token else "mean")
    model = build_model(cfg)
    with torch.no_grad():
        tokens = model.forward_features(torch.randn(1, 3, res, res))
    assert tokens.shape == (1, patches + int(class_token), cfg.width)


@pytest.mark.parametrize("pos_embed", ["learned", "factorized"])
def test_cls_and_mean_pooling_give_logits_of_the_same_shape(pos_embed):
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        a = tiny(pos_embed, "cls")(x)
        b = tiny(pos_embed, "mean")(x)
    assert a.shape == b.shape == (2, 10)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("pos_embed,pool", [("learned", "cls"), ("factorized", "mean")])
def test_batch_independence(pos_embed, pool):
    model = tiny(pos_embed, pool)
    x = torch.randn(4, 3, 32, 48)
    x2 = x.clone()
    x2[3] += 10.0
    with torch.no_grad():
        a, b = model(x), model(x2)
    assert torch.equal(a[:3], b[:3])
    assert not torch.allclose(a[3], b[3])


def test_our_attention_keeps_images_apart_where_default_mha_does_not():
    cfg = variant("tiny", width=64, heads=4)
    x = torch.randn(4, 10, 64)
    x2 = x.clone()
    x2[3] += 10.0
    ours = Attention(cfg).eval()
    mha = nn.MultiheadAttention(64, 4).eval()  # batch_first=False: the trap
    with torch.no_grad():
        assert torch.equal(ours(x)[0], ours(x2)[0])
        assert not torch.allclose(mha(x, x, x)[0][0], mha(x2, x2, x2)[0][0])


@pytest.mark.parametrize("mode,antialias", [("bicubic", False), ("bicubic", True),
                                            ("bilinear", False)])
def test_resample_is_identity_at_native_grid(mode, antialias):
    table = torch.randn(1, 5, 7, 16)
    out = resample_pos_embed(table, (5, 7), mode=mode, antialias=antialias)
    assert torch.equal(out, table)


def test_resample_matches_interpolate_and_changes_grid():
    table = torch.randn(1, 4, 4, 8)
    out = resample_pos_embed(table, (6, 3), mode="bicubic", antialias=True)
    assert out.shape == (1, 6, 3, 8)
    expected = F.interpolate(table.permute(0, 3, 1, 2), size=(6, 3), mode="bicubic",
                             align_corners=False, antialias=True).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("pos_embed", ["learned", "factorized"])
def test_position_table_at_native_grid_is_the_parameter(pos_embed):
    model = tiny(pos_embed)
    prefix, cells = model.pos(model.cfg.grid_size)
    if pos_embed == "learned":
        assert torch.equal(torch.cat([prefix, cells], 1), model.pos.pos_embed)
    else:
        expected = (model.pos.pos_row[:, :, None] + model.pos.pos_col[:, None]).flatten(1, 2)
        assert torch.equal(cells, expected)


def test_factorized_resampling_runs_along_each_axis():
    model = tiny("factorized")
    _, cells = model.pos((6, 4))  # rows resampled 4 -> 6, columns unchanged
    grid = cells.reshape(6, 4, -1)
    rows = F.interpolate(model.pos.pos_row.permute(0, 2, 1)[..., None], size=(6, 1),
                         mode="bicubic", align_corners=False)[0, :, :, 0].T  # (6, D)
    torch.testing.assert_close(grid, rows[:, None] + model.pos.pos_col[0][None], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("hw,match", [((30, 32), "height 30 .* nearest valid sizes: 24 or 32"),
                                      ((32, 4), "width 4 .* nearest valid sizes: 8")])
def test_bad_input_size_is_a_value_error(hw, match):
    with pytest.raises(ValueError, match=match):
        tiny()(torch.randn(1, 3, *hw))


def test_frozen_copy_matches_dynamic_model_and_refuses_other_sizes():
    model = tiny()
    frozen = model.frozen_at(24, 40)
    x = torch.randn(2, 3, 24, 40)
    with torch.no_grad():
        torch.testing.assert_close(frozen(x), model(x))
    with pytest.raises(ValueError, match="frozen at grid"):
        frozen(torch.randn(1, 3, 32, 32))


def test_build_model_is_reproducible():
    a, b = tiny(), tiny()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
    assert np.isfinite(a(x).detach().numpy()).all()
