import io

import numpy as np
import pytest
from PIL import Image

from vit_deploy.runtime.preprocess import ImageError, Preprocess, load_image

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def pre(**kw):
    return Preprocess(**({"resolution": (32, 32), "patch_size": 8, "mean": MEAN, "std": STD} | kw))


def gradient(w=70, h=50):
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
    return np.broadcast_to((x + y) / 2, (h, w, 3)).astype(np.uint8)


def test_every_input_kind_gives_the_same_tensor(tmp_path):
    a = gradient()
    path = tmp_path / "g.png"
    Image.fromarray(a).save(path)
    kinds = [a, Image.fromarray(a), path, str(path), path.read_bytes()]
    outs = [pre()(k) for k in kinds]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    assert outs[0].shape == (3, 32, 32) and outs[0].dtype == np.float32


def test_normalisation_uses_mean_and_std():
    white = np.full((32, 32, 3), 255, np.uint8)
    np.testing.assert_allclose(pre()(white), (1.0 - 0.5) / 0.25)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "LA", "I;16", "CMYK"])
def test_non_rgb_modes_become_rgb(mode):
    image = Image.fromarray(gradient()).convert(mode) if mode != "I;16" else \
        Image.fromarray(gradient()[:, :, 0].astype(np.uint16) * 200)
    assert load_image(image).mode == "RGB"
    assert pre()(image).shape == (3, 32, 32)


def test_transparent_pixels_are_composited_on_white():
    rgba = np.zeros((8, 8, 4), np.uint8)  # fully transparent black
    assert np.asarray(load_image(rgba)).min() == 255


def test_center_crop_keeps_the_middle():
    a = np.zeros((40, 120, 3), np.uint8)
    a[:, 40:80] = 255  # a white middle third
    x = pre(resolution=(40, 40), patch_size=8, interpolation="nearest")(a)
    np.testing.assert_allclose(x, (1.0 - 0.5) / 0.25)  # all white after crop


@pytest.mark.parametrize("wh,expected", [((70, 50), (32, 48)), ((50, 70), (48, 32)),
                                         ((33, 33), (32, 32)), ((300, 20), (32, 480))])
def test_patch_multiple_keeps_aspect_and_divisibility(wh, expected):
    p = pre(resize="patch_multiple")
    x = p(gradient(*wh))
    assert x.shape[1:] == expected
    assert x.shape[1] % 8 == 0 and x.shape[2] % 8 == 0


def test_batches_group_same_sizes_and_keep_order():
    p = pre(resize="patch_multiple")
    images = [gradient(70, 50), gradient(50, 70), gradient(72, 48)]
    groups = p.batches(images)
    assert sorted(i for g, _ in groups for i in g) == [0, 1, 2]
    shapes = {tuple(g): b.shape for g, b in groups}
    assert shapes[(0, 2)] == (2, 3, 32, 48) and shapes[(1,)] == (1, 3, 48, 32)


@pytest.mark.parametrize("make,match", [
    (lambda p: p.write_bytes(b""), "empty"),
    (lambda p: p.write_bytes(b"this is not an image at all"), "not an image"),
    (lambda p: p.write_bytes(_png()[:60]), r"could not be decoded \(OSError: .*truncated"),
])
def test_broken_files_are_image_errors(tmp_path, make, match):
    path = tmp_path / "bad.png"
    make(path)
    with pytest.raises(ImageError, match=match):
        load_image(path)


def test_missing_file_and_wrong_types():
    with pytest.raises(ImageError, match="does not exist"):
        load_image("/nonexistent.png")
    with pytest.raises(ImageError, match="uint8"):
        load_image(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ImageError, match="HxWx3"):
        load_image(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(ImageError, match="expected a path"):
        load_image(3.5)


def test_decompression_bomb_is_refused_before_decoding():
    with pytest.raises(ImageError, match="over the limit"):
        load_image(_png(200, 200), max_pixels=100 * 100)


def test_bad_rule_is_refused():
    with pytest.raises(ValueError, match="resize rule must be one of"):
        pre(resize="stretch")


def _png(w=64, h=64) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(gradient(w, h)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("rule,crop_pct,wh,resized", [
    ("shorter_side_center_crop", 0.875, (640, 480), (256, 341)),  # 224 / 0.875 = 256
    ("shorter_side_center_crop", 0.875, (480, 640), (341, 256)),
    ("shorter_side_center_crop", None, (640, 480), (224, 299)),  # just covers, rounded
    ("squash", None, (640, 480), (224, 224)),
    ("squash", 0.875, (640, 480), (256, 256)),
])
def test_crop_pct_and_squash_resize_then_crop(rule, crop_pct, wh, resized):
    from vit_deploy.runtime.preprocess import resized_size

    assert resized_size(rule, crop_pct, (224, 224), *wh) == resized
    p = pre(resolution=(224, 224), resize=rule, crop_pct=crop_pct)
    assert p(gradient(*wh)).shape == (3, 224, 224)


def test_crop_pct_is_refused_where_it_means_nothing():
    with pytest.raises(ValueError, match="crop_pct must be None under the 'patch_multiple'"):
        pre(resize="patch_multiple", crop_pct=0.9)
    with pytest.raises(ValueError, match="crop_pct must be None or a number from 0.1 to 1"):
        pre(crop_pct=0)


@pytest.mark.parametrize("kind, said", [
    ("fifo", "is a FIFO (named pipe), not an image file"),
    ("device", "is a character device, not an image file"),
    ("directory", "is a directory, not an image file"),
    ("broken link", "is a broken link"), ("missing", "does not exist")])
def test_what_a_path_is_instead_of_an_image_is_said(tmp_path, kind, said):
    """A FIFO was reported as 'does not exist or is not a file' (read as: missing)."""
    import os

    path = tmp_path / "x.png"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "broken link":
        path.symlink_to(tmp_path / "gone.png")
    with pytest.raises(ImageError) as e:
        load_image(path)
    assert str(e.value) == f"image {str(path)!r} {said}"
