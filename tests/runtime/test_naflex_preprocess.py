"""The torch-free NaFlex preprocessing (runtime/naflex/preprocess.py) is transformers'
Siglip2ImageProcessor: the same sizes from the patch budget, and the same floats as its
Pillow backend on the shipped photographs and on synthetic sizes (thin strips, tiny, large,
one pixel high). Its torchvision backend resizes with torch's own antialiased bilinear
kernel, which differs from Pillow's by at most a level or two of 255 on a few pixels
(measured below, and the bound asserted)."""


import numpy as np
import pytest
from PIL import Image

from vit_deploy.data import photo_paths
from vit_deploy.runtime.naflex.preprocess import NaFlexPreprocess, size_for_max_num_patches

T = pytest.importorskip("transformers")

PHOTOS = sorted(photo_paths("calib", core=True) + photo_paths("eval", core=True))
SYNTHETIC = [(50, 120), (300, 40), (17, 17), (1, 500), (500, 1), (640, 480), (33, 1000),
             (16, 16), (15, 17), (2000, 40)]  # (height, width)
BUDGETS = (64, 256, 1024)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    synthetic = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
                 for h, w in SYNTHETIC]
    assert len(PHOTOS) == 12
    return [Image.open(p).convert("RGB") for p in PHOTOS] + synthetic


def test_sizes_are_transformers_for_every_budget():
    from transformers.models.siglip2.image_processing_pil_siglip2 import (
        get_image_size_for_max_num_patches)

    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 4000, (40, 2))] + SYNTHETIC
    for (h, w) in sizes:
        for patch, budget in ((16, 256), (14, 729), (16, 1024), (16, 64), (32, 5)):
            assert size_for_max_num_patches(h, w, patch, budget) == \
                get_image_size_for_max_num_patches(h, w, patch, budget), (h, w, patch, budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_batch_is_the_pillow_processor_exactly(images, budget):
    ours = NaFlexPreprocess(max_num_patches=budget)(images)
    theirs = T.Siglip2ImageProcessorPil(max_num_patches=budget)(images=images,
                                                                 return_tensors="np")
    for name, got in ours.feeds().items():
        want = theirs[name]
        assert (got.shape, got.dtype) == (want.shape, want.dtype), name
        np.testing.assert_array_equal(got, want, err_msg=name)  # bit for bit


def test_torchvision_backend_differs_by_its_resize_kernel_only(images):
    """What Siglip2ImageProcessor (torchvision backend) computes: torch's uint8 bilinear
    antialias resize (torchvision's resize_image on CPU), then (x - 127.5) / 127.5. Against
    Pillow's resize (measured, torch 2.13): at most 1 level of 255 on up to 3.5 % of the
    values of a photograph, 2 levels on 24 % of them for a 2000x40 strip squeezed to 32 wide
    (both kernels round fixed-point weights, differently)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    pre = NaFlexPreprocess(max_num_patches=256)
    worst, fractions = 0.0, []
    for image in images:
        patches, (gh, gw) = pre.patches(image)
        t = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None]  # (1, C, H, W) uint8
        if (gh * 16, gw * 16) != (image.height, image.width):
            t = F.interpolate(t, size=(gh * 16, gw * 16), mode="bilinear", antialias=True)
        x = (t[0].float() - 127.5) / 127.5  # transformers' fused rescale + normalise
        x = x.reshape(3, gh, 16, gw, 16).permute(1, 3, 2, 4, 0).reshape(gh * gw, -1).numpy()
        diff = np.abs(x - patches)
        fractions.append((diff > 1e-6).mean())
        worst = max(worst, float(diff.max()))
    assert worst <= 2 / 127.5 + 1e-6 and max(fractions[:len(PHOTOS)]) < 0.05
    print(f"torchvision-backend emulation vs ours: max abs {worst:.6f} "
          f"({worst * 127.5:.2f} levels of 255), values differing: photographs "
          f"{max(fractions[:len(PHOTOS)]):.2%} at most, all {np.mean(fractions):.2%} on average")


def test_one_image_and_arrays_and_bad_options():
    pre = NaFlexPreprocess(max_num_patches=25, patch_size=8)
    batch = pre(np.full((10, 90, 3), 255, np.uint8))  # one HWC array, not a list
    assert batch.pixel_values.shape == (1, 25, 192) and batch.spatial_shapes.tolist() == [[2, 12]]
    assert batch.pixel_attention_mask.tolist() == [[1] * 24 + [0]]
    assert (batch.pixel_values[0, :24] == 1).all() and not batch.pixel_values[0, 24:].any()
    for bad in (0, 10 ** 6, 2.5, True):
        with pytest.raises(ValueError, match=f"max_num_patches must be an integer from 1 to "
                                             f"65536, got {bad}"):
            NaFlexPreprocess(max_num_patches=bad)
    with pytest.raises(ValueError, match="at least one image, got none"):
        pre([])
