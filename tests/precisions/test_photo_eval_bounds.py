"""What judging holds is bounded (issue: `quantize --eval DIR` kept every image of DIR
decoded at full size, three views each, with no count limit): at most MAX_JUDGED images of a
folder are judged, said in the report's words, and a large photograph is reduced before its
views are cut."""

from __future__ import annotations

from PIL import Image

from vit_deploy.precisions.photos import MAX_JUDGED, VIEW_SIDE, EvalImages, resolve


def test_a_large_folder_is_judged_on_its_first_images_and_says_so(tmp_path):
    folder = tmp_path / "eval"
    folder.mkdir()
    for i in range(MAX_JUDGED + 6):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(folder / f"{i:03d}.png")
    _, judged = resolve("digits", folder)
    assert [p.name for p in judged.paths] == [f"{i:03d}.png" for i in range(MAX_JUDGED)]
    assert f"the first {MAX_JUDGED} of the {MAX_JUDGED + 6} images" in judged.source


def test_a_small_folder_is_judged_whole(tmp_path):
    folder = tmp_path / "eval"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8)).save(folder / f"{i}.png")
    _, judged = resolve("digits", folder)
    assert len(judged.paths) == 3 and judged.source.startswith("3 images in ")


def test_a_large_photograph_is_reduced_before_its_views(tmp_path):
    big = tmp_path / "big.png"
    Image.new("RGB", (5 * VIEW_SIDE, 2 * VIEW_SIDE + 7), "white").save(big)
    small = tmp_path / "small.png"
    Image.new("RGB", (640, 480), "white").save(small)
    views = EvalImages((big, small), "").views()
    assert len(views) == 6
    assert views[0].size == (5 * VIEW_SIDE // 2, -(-(2 * VIEW_SIDE + 7) // 2))  # reduced by 2
    assert all(min(v.size) < 2 * VIEW_SIDE for v in views[:3])
    assert views[3].size == (640, 480)  # a photograph of ordinary size is left as it is


def test_every_unusable_entry_named_like_an_image_is_refused_naming_it(tmp_path):
    """One policy for a --calib / --eval folder (issue: FIFOs and device links were skipped
    silently while one empty .jpg failed the whole command): an entry named like an image that
    is not a regular file is refused, naming it, before anything is opened; entries not named
    like images are not images and stay out of it."""
    import os

    import pytest

    from vit_deploy.precisions.photos import image_files

    folder = tmp_path / "cal"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (8, 8)).save(folder / f"{i}.png")
    os.mkfifo(folder / "notes")  # not named like an image: not one
    assert [p.name for p in image_files(folder, "--calib")] == ["0.png", "1.png"]
    for name, make in [("pipe.jpg", os.mkfifo),
                       ("zero.png", lambda p: os.symlink("/dev/zero", p)),
                       ("gone.webp", lambda p: os.symlink(tmp_path / "nothing", p))]:
        make(folder / name)
        with pytest.raises(ValueError) as e:
            image_files(folder, "--calib")
        said = str(e.value)
        assert name in said and "not an image file" in said and "--calib" in said, said
        os.unlink(folder / name)
