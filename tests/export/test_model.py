import numpy as np
import pytest
import torch
from torch import nn

from vit_deploy.runtime.config import variant
from vit_deploy.export.model import Attention, PatchEmbed, build_model
from vit_deploy.export.pos_embed import resample_pos_embed


def _cubic_resize(a: np.ndarray, size: int, axis: int, A: float = -0.75) -> np.ndarray:
    """Bicubic resampling of one axis written out from its definition (Keys' cubic
    convolution, A = -0.75, half-pixel centres, edge samples repeated): what
    F.interpolate(mode="bicubic", align_corners=False) without antialias computes, in
    float64, to check the model's resampling against something it does not call."""
    a = np.moveaxis(np.asarray(a, np.float64), axis, 0)
    n = a.shape[0]
    out = np.zeros((size, *a.shape[1:]))
    for i in range(size):
        x = (i + 0.5) * n / size - 0.5  # output pixel centre in input coordinates
        f = int(np.floor(x))
        t = x - f
        weights = [((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A,
                   ((A + 2) * t - (A + 3)) * t * t + 1,
                   ((A + 2) * (1 - t) - (A + 3)) * (1 - t) * (1 - t) + 1,
                   ((A * (2 - t) - 5 * A) * (2 - t) + 8 * A) * (2 - t) - 4 * A]
        for k, w in enumerate(weights):
            out[i] += w * a[min(max(f - 1 + k, 0), n - 1)]
    return np.moveaxis(out, 0, axis)


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
def test_cls_and_mean_pooling_give_logits_of_the_same_shape(pos_embed, make_tiny):
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        a = make_tiny(pos_embed, "cls")(x)
        b = make_tiny(pos_embed, "mean")(x)
    assert a.shape == b.shape == (2, 10)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("pos_embed,pool", [("learned", "cls"), ("factorized", "mean")])
def test_batch_independence(pos_embed, pool, make_tiny):
    model = make_tiny(pos_embed, pool)
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
        assert torch.equal(ours(x)[0][:3], ours(x2)[0][:3])  # (output, keys): images 0-2
        assert not torch.allclose(mha(x, x, x)[0][0], mha(x2, x2, x2)[0][0])


@pytest.mark.parametrize("mode,antialias", [("bicubic", False), ("bicubic", True),
                                            ("bilinear", False)])
def test_resample_is_identity_at_native_grid(mode, antialias):
    table = torch.randn(1, 5, 7, 16)
    out = resample_pos_embed(table, (5, 7), mode=mode, antialias=antialias)
    assert torch.equal(out, table)


@pytest.mark.parametrize("antialias", [False, True])
def test_resample_matches_an_independent_bicubic_and_changes_grid(antialias):
    from PIL import Image

    table = torch.randn(1, 4, 4, 8)
    out = resample_pos_embed(table, (6, 3), mode="bicubic", antialias=antialias)
    assert out.shape == (1, 6, 3, 8)  # rows 4 -> 6 (up), columns 4 -> 3 (down)
    grid = table[0].numpy()  # (gh, gw, D)
    if antialias:  # torch's antialiased bicubic is Pillow's (A = -0.5, widened when shrinking)
        expected = np.stack([np.asarray(Image.fromarray(grid[:, :, c]).resize(
            (3, 6), Image.Resampling.BICUBIC)) for c in range(8)], axis=-1)
    else:
        expected = _cubic_resize(_cubic_resize(grid, 6, axis=0), 3, axis=1)
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pos_embed", ["learned", "factorized"])
def test_position_table_at_native_grid_is_the_parameter(pos_embed, make_tiny):
    model = make_tiny(pos_embed)
    gh, gw = model.cfg.grid_size
    prefix, cells = model.pos((gh, gw))
    if pos_embed == "learned":
        assert torch.equal(torch.cat([prefix, cells], 1), model.pos.pos_embed)
    else:  # cell (i, j), in raster order, is row i + column j
        for i in range(gh):
            for j in range(gw):
                assert torch.equal(cells[0, i * gw + j],
                                   model.pos.pos_row[0, i] + model.pos.pos_col[0, j])


def test_factorized_resampling_runs_along_each_axis(make_tiny):
    model = make_tiny("factorized")
    with torch.no_grad():
        _, cells = model.pos((6, 4))  # rows resampled 4 -> 6, columns unchanged
    grid = cells.reshape(6, 4, -1).numpy()
    rows = _cubic_resize(model.pos.pos_row[0].detach().numpy(), 6, axis=0)  # (6, D)
    cols = model.pos.pos_col[0].detach().numpy()  # (4, D)
    np.testing.assert_allclose(grid, rows[:, None] + cols[None], rtol=0, atol=1e-6)


@pytest.mark.parametrize("hw,match", [((30, 32), "height 30 .* nearest valid sizes: 24 or 32"),
                                      ((32, 4), "width 4 .* nearest valid sizes: 8")])
def test_bad_input_size_is_a_value_error(hw, match, make_tiny):
    with pytest.raises(ValueError, match=match):
        make_tiny()(torch.randn(1, 3, *hw))


def test_frozen_copy_matches_dynamic_model_and_refuses_other_sizes(make_tiny):
    model = make_tiny()
    frozen = model.frozen_at(24, 40)
    x = torch.randn(2, 3, 24, 40)
    with torch.no_grad():
        torch.testing.assert_close(frozen(x), model(x))
    with pytest.raises(ValueError, match="frozen at grid"):
        frozen(torch.randn(1, 3, 32, 32))


def test_build_model_is_reproducible(make_tiny):
    a, b = make_tiny(), make_tiny()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
    assert np.isfinite(a(x).detach().numpy()).all()
