"""Hostile and unusual images: every failure is an ImageError, sizes are refused before any
pixel is allocated, and the pixels that do come out are right (EXIF, 16-bit, float, alpha)."""

import io
import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import (
    GifImagePlugin,
    Image,
    ImageFile,
    PngImagePlugin,
    TiffImagePlugin,
    WebPImagePlugin,
)

from vit_deploy.runtime.preprocess import (
    MAX_PIXELS,
    MAX_SIDE,
    ImageError,
    Preprocess,
    load_image,
)

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
FUZZ_MAX_PIXELS = 1 << 20  # mutated headers may claim big sizes; keep the decodes small
ignore_bomb_warning = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")


def pre(**kw):
    return Preprocess(**({"resolution": (32, 32), "patch_size": 8, "mean": (0.5,) * 3,
                          "std": (0.25,) * 3} | kw))


def save(image, fmt, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def quadrants(w=24, h=16) -> np.ndarray:
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 2, w // 2:] = (0, 255, 0)
    a[h // 2:, : w // 2] = (0, 0, 255)
    a[h // 2:, w // 2:] = (255, 255, 255)
    return a


def exif(orientation: int) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation  # Orientation
    return e.tobytes()


def _corpus() -> dict[str, bytes]:
    rgb = Image.fromarray(quadrants())
    palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=4)
    frames = [Image.new("RGB", (12, 8), (40 * i, 0, 0)) for i in range(3)]
    return {
        "png": save(rgb, "PNG"),
        "png_rgba": save(rgb.convert("RGBA"), "PNG"),
        "png_palette_transparent": save(palette, "PNG", transparency=0),
        "png_16bit": save(Image.fromarray(quadrants()[:, :, 0].astype(np.uint16) * 257), "PNG"),
        "jpeg_exif": save(rgb, "JPEG", exif=exif(6)),
        "gif_animated": save(frames[0], "GIF", save_all=True, append_images=frames[1:]),
        "bmp": save(rgb, "BMP"),
        "tiff_deflate": save(rgb, "TIFF", compression="tiff_adobe_deflate"),
        "webp": save(rgb, "WEBP", lossless=True),
    }


CORPUS = _corpus()
MAGIC = {"png": 8, "gif": 6, "bmp": 2, "jpeg": 3, "tiff": 4, "webp": 12}  # bytes kept intact


@st.composite
def mutated(draw, name: str) -> bytes:
    """1-4 edits (set a byte, truncate, insert, delete) after the format's magic bytes (so
    the mutant reaches its format's parser), half of them in the next 64 bytes, where the
    headers that parsers branch on are; PNGs may then get their chunk checksums fixed, so
    the mutant also gets past them."""
    out, keep = bytearray(CORPUS[name]), MAGIC[name.split("_")[0]]
    for _ in range(draw(st.integers(1, 4))):
        if len(out) <= keep:
            break
        i = keep + draw(st.integers(0, min(len(out) - keep, 64) - 1)
                        | st.integers(0, len(out) - keep - 1))
        kind = draw(st.sampled_from(("set", "truncate", "insert", "delete")))
        if kind == "set":
            out[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del out[i:]
        elif kind == "insert":
            out[i:i] = draw(st.binary(min_size=1, max_size=16))
        else:
            del out[i:i + draw(st.integers(1, 16))]
    if name.startswith("png") and draw(st.booleans()):
        return fix_png_crcs(bytes(out))
    return bytes(out)


def fix_png_crcs(data: bytes) -> bytes:
    """Recompute the checksum of every chunk whose length field still fits in `data`."""
    out, i = bytearray(data), 8
    while i + 12 <= len(out):
        (length,) = struct.unpack(">I", out[i:i + 4])
        end = i + 8 + length
        if end + 4 > len(out):
            break
        out[end:end + 4] = struct.pack(">I", zlib.crc32(out[i + 4:end]))
        i = end + 4
    return bytes(out)


def decoded_or_refused(data: bytes) -> Image.Image | None:
    """load_image's two allowed outcomes: a fully decoded RGB image, or an ImageError."""
    try:
        image = load_image(data, max_pixels=FUZZ_MAX_PIXELS)
    except ImageError:
        return None
    assert image.mode == "RGB" and 1 <= image.width * image.height <= FUZZ_MAX_PIXELS
    assert np.asarray(image).shape == (image.height, image.width, 3)
    return image


# -- 1. every decoder error is an ImageError -------------------------------------------------

@ignore_bomb_warning
@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow's "Corrupt EXIF data" and kin
@pytest.mark.parametrize("name", sorted(CORPUS))
@FUZZ
@given(data=st.data())
def test_mutated_files_decode_or_raise_image_error(name, data):
    image = decoded_or_refused(data.draw(mutated(name)))
    if image is None:
        return
    for rule in ("patch_multiple", "shorter_side_center_crop"):
        try:
            x = pre(resize=rule).array(image)
        except ImageError as e:  # only the resize guard may refuse a decoded image
            assert "expected sides of at most" in str(e) or "over the limit" in str(e)
        else:
            assert x.dtype == np.float32 and x.shape[0] == 3 and np.isfinite(x).all()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_unmutated_corpus_decodes(name):
    assert decoded_or_refused(CORPUS[name]) is not None


STAGES = {  # where the fault is injected -> (what to patch, an input that reaches it)
    "open": (Image, "open", CORPUS["png"]),
    "load": (ImageFile.ImageFile, "load", CORPUS["png"]),
    "getexif": (Image.Image, "getexif", CORPUS["png"]),
    "transpose": (Image.Image, "transpose", CORPUS["jpeg_exif"]),
    "convert": (Image.Image, "convert", CORPUS["png_palette_transparent"]),
}
FAULTS = [NotImplementedError, AttributeError, SyntaxError, struct.error, MemoryError,
          IndexError, TypeError, EOFError, OSError, ValueError, KeyError, ZeroDivisionError,
          RecursionError, AssertionError, zlib.error, Image.DecompressionBombError]


def _raiser(error: BaseException):
    def fail(*args, **kwargs):
        raise error
    return fail


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("fault", FAULTS, ids=lambda t: t.__name__)
def test_any_decoder_exception_becomes_image_error(monkeypatch, stage, fault):
    owner, attr, data = STAGES[stage]
    monkeypatch.setattr(owner, attr, _raiser(fault("boom")))
    with pytest.raises(ImageError, match="boom") as caught:
        load_image(data)
    assert fault.__name__ in str(caught.value)  # the original type is named
    assert isinstance(caught.value.__cause__, fault)  # and kept for the traceback


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("fault", [KeyboardInterrupt, SystemExit], ids=lambda t: t.__name__)
def test_interrupts_are_not_swallowed(monkeypatch, stage, fault):
    owner, attr, data = STAGES[stage]
    monkeypatch.setattr(owner, attr, _raiser(fault()))
    with pytest.raises(fault):
        load_image(data)


def test_error_names_the_file_the_type_and_the_message(monkeypatch, tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(CORPUS["png"])
    monkeypatch.setattr(ImageFile.ImageFile, "load",
                        _raiser(struct.error("unpack requires a buffer of 4 bytes")))
    with pytest.raises(ImageError) as caught:
        load_image(path)
    assert str(caught.value) == (f"image {str(path)!r} could not be decoded "
                                 f"(struct.error: unpack requires a buffer of 4 bytes)")


def test_a_huge_decoder_message_is_cut_short(monkeypatch):
    monkeypatch.setattr(ImageFile.ImageFile, "load", _raiser(ValueError("x" * 100_000)))
    with pytest.raises(ImageError) as caught:
        load_image(CORPUS["png"])
    assert len(str(caught.value)) < 400 and str(caught.value).endswith("...)")


# -- 2. sizes are refused before any pixel is allocated -------------------------------------

def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header(w: int, h: int) -> bytes:
    """A valid PNG signature and IHDR (8-bit RGB) claiming w x h, with a token IDAT."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
            + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b""))


def gif_header(w: int, h: int) -> bytes:
    screen = b"GIF89a" + struct.pack("<HHBBB", w, h, 0, 0, 0)
    return screen + b"," + struct.pack("<HHHHB", 0, 0, w, h, 0) + b"\x02\x02\x44\x01\x00;"


def bmp_header(w: int, h: int) -> bytes:
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + 16, 0, 0, 54) + info + b"\0" * 16


JPEG_16 = save(Image.new("RGB", (16, 16)), "JPEG")  # made here: the tests patch decoding


def jpeg_header(w: int, h: int) -> bytes:
    """A real 16x16 JPEG whose start-of-frame claims w x h."""
    data = bytearray(JPEG_16)
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", h, w)
    return bytes(data)


@pytest.fixture
def no_decoding(monkeypatch):
    """Every decode (Image.load, ImageFile.load) is recorded and fails the test loudly."""
    calls = []

    def load(self, *args, **kwargs):
        calls.append(self.size)
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(Image.Image, "load", load)
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return calls


HUGE = [(100_000, 100_000),  # past Pillow's own bound (2x ours)
        (65_535, 1_400),  # past ours only: 91.7 M pixels
        (9_460, 9_460)]  # 89,491,600: just past ours


@ignore_bomb_warning
@pytest.mark.parametrize("make,w,h", [(make, w, h) for make in (png_header, bmp_header)
                                      for w, h in HUGE] +
                         [(make, w, h) for make in (gif_header, jpeg_header)  # 16-bit sides
                          for w, h in HUGE[1:]])
def test_header_claiming_a_huge_size_is_refused_without_decoding(no_decoding, make, w, h):
    data = make(w, h)
    with pytest.raises(ImageError, match="over the limit"):
        load_image(data)
    assert no_decoding == []


@ignore_bomb_warning
@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(w=st.integers(2, 2**31 - 1), h=st.integers(1, 2**31 - 1), slack=st.integers(1, 1000))
def test_any_png_header_over_max_pixels_is_refused_without_decoding(w, h, slack):
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ImageFile.ImageFile, "load", lambda self, *a: calls.append(self.size))
        with pytest.raises(ImageError, match="over the limit"):
            load_image(png_header(w, h), max_pixels=max(1, w * h - slack))
    assert calls == []


@ignore_bomb_warning
def test_an_opened_but_undecoded_pil_image_is_checked_before_decoding(no_decoding):
    image = Image.open(io.BytesIO(png_header(10_000, 10_000)))
    with pytest.raises(ImageError, match="PIL image is 10000x10000 = 100000000 pixels, over"):
        load_image(image)
    assert no_decoding == []


def test_big_arrays_and_pil_images_are_refused_before_copying():
    # 20000 x 20000 x 3 without the memory: a copy would allocate 1.2 GB
    huge = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (20_000, 20_000, 3))
    with pytest.raises(ImageError, match=f"20000x20000 = 400000000 pixels, over .* {MAX_PIXELS}"):
        load_image(huge)
    with pytest.raises(ImageError, match="image array is 300x200 = 60000 pixels, over"):
        load_image(np.zeros((200, 300, 3), np.uint8), max_pixels=50_000)
    with pytest.raises(ImageError, match="PIL image is 300x200 = 60000 pixels, over"):
        load_image(Image.new("RGB", (300, 200)), max_pixels=50_000)
    with pytest.raises(ImageError, match="PIL image is 0x3: expected at least 1x1"):
        load_image(Image.new("RGB", (0, 3)))


class _SizeOnly:
    """Stands in for an image of any size: Preprocess.array reads .size, then resizes."""

    def __init__(self, w, h):
        self.size = (w, h)

    def resize(self, size, resample=None):
        raise _Resized(size)


class _Resized(Exception):
    pass


def _cover(pre_, w, h):
    """The shorter-side center crop first scales the image to cover the crop (W, H)."""
    th, tw = pre_.target_size(w, h)
    s = max(th / h, tw / w)
    return max(tw, round(w * s)), max(th, round(h * s))


@pytest.mark.parametrize("rule,resolution,patch,wh", [
    ("patch_multiple", (224, 224), 16, (1, 40_000)),  # 224 x 8,960,000
    ("patch_multiple", (224, 224), 16, (40_000, 1)),
    ("patch_multiple", (32, 32), 8, (513, 1)),  # 16416 wide: just past MAX_SIDE
    ("shorter_side_center_crop", (224, 224), 16, (1, 100_000)),  # covers at 224 x 22.4 M
])
def test_a_gigantic_resize_target_is_refused_before_resizing(monkeypatch, rule, resolution,
                                                              patch, wh):
    monkeypatch.setattr(Image.Image, "resize", _raiser(AssertionError("resized")))
    p = pre(resize=rule, resolution=resolution, patch_size=patch)
    with pytest.raises(ImageError, match=r"expected sides of at most 16384|over the limit"):
        p(np.zeros((wh[1], wh[0]), np.uint8))


def test_a_target_at_the_side_limit_is_allowed():
    x = pre(resize="patch_multiple")(np.zeros((1, 512), np.uint8))  # -> 32 x 16384
    assert x.shape == (3, 32, MAX_SIDE)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(w=st.integers(1, 200_000), h=st.integers(1, 200_000),
       rule=st.sampled_from(["patch_multiple", "shorter_side_center_crop"]),
       side=st.integers(1, 64).map(lambda k: 16 * k))
def test_resize_guard_refuses_exactly_the_oversized(w, h, rule, side):
    p = pre(resize=rule, resolution=(side, side), patch_size=16)
    th, tw = p.target_size(w, h)
    made = (tw, th) if rule == "patch_multiple" else _cover(p, w, h)
    too_big = max(th, tw) > MAX_SIDE or made[0] * made[1] > MAX_PIXELS
    try:
        p.array(_SizeOnly(w, h))
    except ImageError:
        assert too_big
    except _Resized as resized:
        assert not too_big and resized.args[0] == made


def _frames(n=60):
    """Neighbours differ, so no encoder merges them; the first is (0, 100, 0)."""
    return [Image.new("RGB", (8, 8), (200, 0, 50) if i % 2 else (0, 100, 0)) for i in range(n)]


def test_only_the_first_gif_frame_is_decoded(monkeypatch):
    frames = _frames()
    data = save(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert Image.open(io.BytesIO(data)).n_frames == 60
    seen = _record(monkeypatch, GifImagePlugin.GifImageFile, "_seek")
    assert np.asarray(load_image(data))[0, 0].tolist() == [0, 100, 0]
    assert seen == [0]


@pytest.mark.parametrize("fmt,plugin,method", [
    ("PNG", PngImagePlugin.PngImageFile, "_seek"),  # APNG
    ("TIFF", TiffImagePlugin.TiffImageFile, "_seek"),  # multi-page
    ("WEBP", WebPImagePlugin.WebPImageFile, "_get_next"),  # one call per frame decoded
])
def test_only_the_first_frame_of_other_animations_is_decoded(monkeypatch, fmt, plugin, method):
    frames = _frames()
    data = save(frames[0], fmt, save_all=True, append_images=frames[1:], lossless=True)
    assert Image.open(io.BytesIO(data)).n_frames == 60
    seen = _record(monkeypatch, plugin, method)
    assert np.asarray(load_image(data))[0, 0].tolist() == [0, 100, 0]
    assert seen in ([0], [None])  # frame 0 only (_get_next takes no frame number)


def _record(monkeypatch, cls, method):
    seen, original = [], getattr(cls, method)

    def record(self, *args, **kwargs):
        seen.append(args[0] if args else None)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, record)
    return seen


# -- 3. correct pixels ----------------------------------------------------------------------

ORIENTED = {  # EXIF Orientation -> how the stored pixels are shown (the EXIF 2.3 table)
    1: lambda a: a, 2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1], 5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),  # 90 degrees clockwise
    7: lambda a: np.rot90(a, 2).transpose(1, 0, 2), 8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize("orientation", sorted(ORIENTED))
def test_exif_orientation_is_applied_exactly(orientation):
    a = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    data = save(Image.fromarray(a), "PNG", exif=exif(orientation))
    np.testing.assert_array_equal(np.asarray(load_image(data)), ORIENTED[orientation](a))


def test_jpeg_with_orientation_6_comes_out_rotated_clockwise(tmp_path):
    a = np.zeros((16, 32, 3), np.uint8)
    a[:, 16:] = 255  # left half black, right half white; shown rotated: top black
    data = save(Image.fromarray(a), "JPEG", quality=95, exif=exif(6))
    path = tmp_path / "photo.jpg"
    path.write_bytes(data)
    caller_image = Image.open(io.BytesIO(data))
    for src in (data, path, caller_image):
        out = np.asarray(load_image(src)).astype(int)
        assert out.shape == (32, 16, 3)
        assert np.abs(out - np.rot90(a, -1)).mean() < 4  # JPEG is lossy
        assert out[:12].max() < 40 and out[20:].min() > 215
    assert caller_image.size == (32, 16)  # the caller's image was not rotated in place


@pytest.mark.parametrize("orientation", [0, 9, 65535])
def test_an_out_of_range_orientation_leaves_the_image_as_it_is(orientation):
    a = quadrants()
    data = save(Image.fromarray(a), "PNG", exif=exif(orientation))
    np.testing.assert_array_equal(np.asarray(load_image(data)), a)


SIXTEEN = [  # (16-bit value, its 8-bit value v * 255 / 65535 rounded), worked out by hand
    (0, 0), (1, 0), (128, 0), (129, 1), (257, 1), (25_700, 100), (32_768, 128),
    (51_528, 200), (51_529, 201), (65_534, 255), (65_535, 255)]


def _sixteen_bit_inputs(values: np.ndarray) -> dict[str, object]:
    image = Image.fromarray(values)  # "I;16"
    return {"png": save(image, "PNG"), "tiff": save(image, "TIFF"), "I;16": image,
            "I;16B": Image.frombytes("I;16B", image.size, values.astype(">u2").tobytes()),
            "I;16L": Image.frombytes("I;16L", image.size, values.astype("<u2").tobytes()),
            "I": Image.fromarray(values.astype(np.int32))}


@pytest.mark.parametrize("kind", ["png", "tiff", "I;16", "I;16B", "I;16L", "I"])
def test_16_bit_images_are_scaled_not_clipped(kind):
    values = np.array([[v for v, _ in SIXTEEN]], np.uint16)
    src = _sixteen_bit_inputs(values)[kind]
    if isinstance(src, bytes):
        assert Image.open(io.BytesIO(src)).mode == "I;16"  # what the test is about
    out = np.asarray(load_image(src))
    assert out[0, :, 0].tolist() == [e for _, e in SIXTEEN]
    assert (out == out[:, :, :1]).all()  # grey


def test_mode_i_outside_16_bits_is_clipped():
    out = np.asarray(load_image(Image.fromarray(np.array([[-5, 70_000, 65_535]], np.int32))))
    assert out[0, :, 0].tolist() == [0, 255, 255]


def test_a_white_16_bit_png_is_white_model_input():
    data = save(Image.fromarray(np.full((32, 32), 65_535, np.uint16)), "PNG")
    np.testing.assert_allclose(pre()(data), (1.0 - 0.5) / 0.25)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(values=st.lists(st.integers(0, 65_535), min_size=1, max_size=64))
def test_any_16_bit_png_scales_by_255_over_65535(values):
    data = save(Image.fromarray(np.array([values], np.uint16)), "PNG")
    expected = [(v * 255 + 65_535 // 2) // 65_535 for v in values]  # integer rounding
    assert np.asarray(load_image(data))[0, :, 0].tolist() == expected


FLOATS = [(0.0, 0), (0.25, 64), (0.5, 128), (0.998, 254), (1.0, 255), (1.5, 255), (-1.0, 0),
          (math.nan, 0), (math.inf, 255), (-math.inf, 0)]  # F: 0..1 -> 0..255, clipped


@pytest.mark.parametrize("kind", ["pil", "tiff"])
def test_float_images_read_0_to_1_as_0_to_255(kind):
    image = Image.fromarray(np.array([[v for v, _ in FLOATS]], np.float32))
    assert image.mode == "F"
    src = image if kind == "pil" else save(image, "TIFF")
    assert np.asarray(load_image(src))[0, :, 0].tolist() == [e for _, e in FLOATS]


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(values=st.lists(st.floats(width=32), min_size=1, max_size=64))
def test_any_float_image_rounds_the_clipped_value_times_255(values):
    out = np.asarray(load_image(Image.fromarray(np.array([values], np.float32))))[0, :, 0]
    for v, o in zip(values, out.tolist()):
        want = 0.0 if math.isnan(v) else min(max(v, 0.0), 1.0) * 255
        assert abs(o - want) <= 0.5 + 1e-4, (v, o)


PALETTE = [(255, 0, 0), (0, 128, 0), (0, 0, 255), (10, 20, 30)]


def _palette_image() -> Image.Image:
    image = Image.fromarray(np.array([[0, 1, 2, 3]], np.uint8), mode="P")
    image.putpalette([c for rgb in PALETTE for c in rgb])
    return image


@pytest.mark.parametrize("kind", ["pil", "png", "gif"])
@pytest.mark.parametrize("transparent", [False, True])
def test_palette_images_keep_their_colours_and_transparency_is_white(kind, transparent):
    image = _palette_image()
    kw = {"transparency": 0} if transparent else {}
    if kind == "pil":
        image.info.update(kw)
        src = image
    else:
        src = save(image, kind.upper(), **kw)
    expected = [(255, 255, 255) if transparent else PALETTE[0]] + PALETTE[1:]
    assert [tuple(p) for p in np.asarray(load_image(src))[0].tolist()] == expected


@pytest.mark.parametrize("cmyk,rgb", [((0, 0, 0, 0), (255, 255, 255)),
                                      ((255, 0, 0, 0), (0, 255, 255)),
                                      ((0, 255, 255, 0), (255, 0, 0)),
                                      ((0, 0, 0, 255), (0, 0, 0))])
def test_cmyk_becomes_rgb(cmyk, rgb):
    out = load_image(Image.new("CMYK", (2, 2), cmyk))
    assert out.getpixel((1, 1)) == rgb
    jpeg = np.asarray(load_image(save(Image.new("CMYK", (8, 8), cmyk), "JPEG", quality=95)))
    assert np.abs(jpeg.astype(int) - rgb).max() <= 3


@pytest.mark.parametrize("mode,value,rgb", [
    ("LA", (100, 255), (100, 100, 100)), ("LA", (100, 0), (255, 255, 255)),
    ("LA", (100, 128), (177, 177, 177)),  # 100 * 128/255 + 255 * 127/255 = 177.2
    ("RGBA", (200, 0, 0, 128), (227, 127, 127)),  # (200 * 128 + 255 * 127) / 255 = 227.4
    ("L", 77, (77, 77, 77)), ("1", 1, (255, 255, 255)), ("1", 0, (0, 0, 0)),
])
def test_grey_alpha_and_bilevel_modes(mode, value, rgb):
    image = Image.new(mode, (4, 4), value)
    for src in (image, save(image, "PNG")):
        out = np.asarray(load_image(src))[0, 0].astype(int)
        assert np.abs(out - rgb).max() <= 1, (src if isinstance(src, Image.Image) else "png", out)


def test_an_rgb_png_colour_key_is_composited_on_white():
    a = np.array([[[0, 0, 0], [9, 8, 7]]], np.uint8)
    data = save(Image.fromarray(a), "PNG", transparency=(0, 0, 0))
    assert np.asarray(load_image(data))[0].tolist() == [[255, 255, 255], [9, 8, 7]]


@pytest.mark.parametrize("mode", Image.MODES)
def test_every_pillow_mode_becomes_rgb(mode):
    out = load_image(Image.new(mode, (4, 3)))
    assert out.mode == "RGB" and out.size == (4, 3)
