"""svc.model.images: the shared decode path (EXIF orientation) and the bounded-resize checks."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import ExifTags, Image

from svc.contract import status as st
from svc.model.images import MAX_RESIZED_PIXELS, ItemInputError, check_resize, open_image, short_side_size
from tests.support.images import jpeg_with_orientation, stored_pixels

MAX_PIXELS = 40_000_000


def noise(width: int, height: int, seed: int = 3) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


# -- EXIF orientation ----------------------------------------------------------------------------


@pytest.mark.parametrize(("orientation", "method"), [(6, Image.Transpose.ROTATE_270), (8, Image.Transpose.ROTATE_90),
                                                     (3, Image.Transpose.ROTATE_180)])
def test_exif_orientation_is_applied_once(orientation, method):
    """A tagged JPEG reaches the model as a viewer shows it: the stored
    pixels transposed, the size swapped for 90-degree turns, the tag gone
    (so that nothing downstream turns it again)."""
    data = jpeg_with_orientation(noise(40, 24), orientation)
    image = open_image(data, MAX_PIXELS)
    expected = stored_pixels(data).transpose(method)
    assert image.size == expected.size == ((24, 40) if orientation in (6, 8) else (40, 24))
    assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(expected.convert("RGB")))
    assert image.getexif().get(ExifTags.Base.Orientation) is None


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_exif_orientation_of_lossless_formats(fmt):
    """The tag is honoured whatever the container (PNG eXIf chunk, WebP EXIF chunk)."""
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    buf = io.BytesIO()
    stored = noise(30, 20)
    stored.save(buf, fmt, exif=exif.tobytes(), **({"lossless": True} if fmt == "WEBP" else {}))
    image = open_image(buf.getvalue(), MAX_PIXELS)
    assert image.size == (20, 30)
    assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(stored.transpose(Image.Transpose.ROTATE_270)))


@pytest.mark.parametrize("orientation", [None, 1, 0, 9])
def test_upright_images_stay_lazy(orientation):
    """Without a transposing tag (absent, 1, or an invalid value) the image
    is returned undecoded, so that a model can still ask for a reduced-scale
    JPEG decode (``draft``)."""
    data = jpeg_with_orientation(noise(640, 480), orientation)
    image = open_image(data, MAX_PIXELS)
    assert image.format == "JPEG" and image.size == (640, 480)
    image.draft("RGB", (160, 120))
    assert image.size == (160, 120)


def test_pixel_limit_is_checked_before_the_transpose():
    """``max_image_pixels`` holds for tagged images too, before any pixel is decoded."""
    with pytest.raises(ItemInputError) as caught:
        open_image(jpeg_with_orientation(noise(40, 24), 6), max_pixels=40 * 24 - 1)
    assert caught.value.status == st.INVALID_IMAGE
    assert caught.value.message == "image is 40x24 = 960 pixels; at most 959 are accepted (max_image_pixels)"


def test_a_decompression_bomb_fails_as_an_image_too_large():
    """A small PNG that claims 50000x50000: Pillow refuses it before max_image_pixels is read, and its item was
    told "not a decodable image"."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 50000, 50000, 8, 2, 0, 0, 0))
    with pytest.raises(ItemInputError) as caught:
        open_image(bomb + chunk(b"IEND", b""), max_pixels=MAX_PIXELS)
    assert caught.value.status == st.INVALID_IMAGE
    assert caught.value.message.startswith("image is too large (Image size (2500000000 pixels) exceeds limit of ")
    assert caught.value.message.endswith(f"; at most {MAX_PIXELS} pixels are accepted (max_image_pixels)")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP", "DIB", "TIFF", "AVIF", "JPEG2000", "PPM", "TGA",
                                 "ICO", "QOI"])
def test_the_image_formats_a_client_may_send_are_read(fmt):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buffer, fmt)
    image = open_image(buffer.getvalue(), max_pixels=MAX_PIXELS)
    assert (image.format, image.size) == (fmt, (8, 8))


@pytest.mark.parametrize("fmt", ["EPS", "PCX", "SGI"])
def test_formats_outside_the_list_are_not_opened(fmt, monkeypatch):
    """A security probe: an EPS body reached Pillow's EPS reader, which runs Ghostscript on the client's PostScript
    ("Unable to locate Ghostscript on paths" where it is not installed). Only the listed formats are tried."""
    from PIL import EpsImagePlugin

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buffer, fmt)
    monkeypatch.setattr(EpsImagePlugin, "has_ghostscript", lambda: pytest.fail("Ghostscript was looked for"))
    with pytest.raises(ItemInputError) as caught:
        open_image(buffer.getvalue(), max_pixels=MAX_PIXELS).load()
    assert (caught.value.status, caught.value.message) == (
        st.INVALID_IMAGE, "not a decodable image (JPEG, PNG, WebP, GIF, BMP, TIFF, AVIF, JPEG 2000, PNM, TGA, ICO or QOI)")


def test_base64_wrapped_in_lines_as_the_base64_command_writes_it_is_read():
    import base64

    from svc.model.images import decode_base64

    data = bytes(range(256)) * 3
    wrapped = base64.encodebytes(data).decode()  # 76 characters a line, as `base64 file` and MIME write it
    assert "\n" in wrapped.strip()
    assert decode_base64(wrapped) == decode_base64(wrapped.replace("\n", "\r\n")) == data
    with pytest.raises(ItemInputError, match="not valid base64"):
        decode_base64(wrapped.replace("\n", "\n*"))


@pytest.mark.parametrize("text, said", [
    ("QUJD RA==", "not valid base64: ' ' at character 4 is not in the base64 alphabet (A-Z, a-z, 0-9, '+', '/')"),
    ("QUJDR!", "not valid base64: '!' at character 5 is not in the base64 alphabet (A-Z, a-z, 0-9, '+', '/')"),
    ("QU\u00e9JD", "not valid base64: '\\xe9' at character 2 is not in the base64 alphabet (A-Z, a-z, 0-9, '+', "
                  "'/')"),
    ("QU=JDRA", "not valid base64: '=' padding at character 2, before the end"),
    ("-_-_", "not valid base64: '-' at character 0 is not in the base64 alphabet (A-Z, a-z, 0-9, '+', '/') (the "
             "URL-safe alphabet: use '+' and '/')"),
    ("QUJDR", "not valid base64: wrong length"),
    # Where it is in the string sent (a regression probe: it counted from the data URL's comma, without line breaks)
    ("data:image/png;base64,iVBORw0K-GgoAAAA", "not valid base64: '-' at character 30 is not in the base64 alphabet "
                                               "(A-Z, a-z, 0-9, '+', '/') (the URL-safe alphabet: use '+' and '/')"),
    ("  iVBORw0K\nGgo!AAAA", "not valid base64: '!' at character 14 is not in the base64 alphabet (A-Z, a-z, 0-9, "
                            "'+', '/')"),
], ids=["space", "bang", "non-ascii", "inner padding", "url-safe", "length", "data url", "wrapped"])
def test_a_string_that_is_not_base64_is_told_which_character_is_wrong(text, said):
    """One stray character (a space, ``!``, a non-ASCII letter, an inner ``=``) was "not valid base64: wrong length",
    which sent the user to count characters (image-input probe)."""
    from svc.model.images import decode_base64

    with pytest.raises(ItemInputError) as caught:
        decode_base64(text)
    assert (caught.value.status, caught.value.message) == (st.INVALID_IMAGE, said)


@pytest.mark.parametrize("url", ["DATA:image/png;BASE64,QUJD", "  data:image/png;base64,QUJD", "data:;base64, QUJD"])
def test_a_data_url_is_read_whatever_the_case_of_its_scheme_and_around_whitespace(url):
    """``DATA:image/png;base64,...`` (schemes are case-insensitive) and a data URL after whitespace were refused as
    "not valid base64", where a bare base64 string after whitespace was read (image-input probe)."""
    from svc.model.images import decode_base64

    assert decode_base64(url) == b"ABC"


# -- bounded resizing ----------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), [((8000, 1), (640, 0)), ((1, 8000), (0, 256))])
def test_a_resize_with_an_empty_side_fails_the_item(source, target):
    """An aspect ratio that leaves no pixel along one side is status 5, with
    the image's size and the resize in the error text."""
    with pytest.raises(ItemInputError) as caught:
        check_resize(source, target)
    assert caught.value.status == st.INVALID_IMAGE
    w, h = source
    assert caught.value.message == (
        f"image is {w}x{h}: its aspect ratio is too extreme for this model "
        f"(resized to the model's input it would be {target[0]}x{target[1]} pixels)"
    )


def test_a_resize_past_the_pixel_bound_fails_the_item():
    """The output size is bounded, not only the input's: an 8000x1 image
    resized to a short side of 256 would be 524 million pixels."""
    with pytest.raises(ItemInputError) as caught:
        check_resize((8000, 1), short_side_size(8000, 1, 256))
    assert caught.value.status == st.INVALID_IMAGE
    assert caught.value.message == (
        "image is 8000x1: its aspect ratio is too extreme for this model "
        "(resized to the model's input it would be 2048000x256 = 524288000 pixels; at most 16777216 are allowed)"
    )


def test_the_bound_itself_is_allowed():
    """Exactly MAX_RESIZED_PIXELS passes (256:1 with a short side of 256); one more pixel fails."""
    check_resize((65536, 256), (65536, 256))
    assert 65536 * 256 == MAX_RESIZED_PIXELS
    with pytest.raises(ItemInputError):
        check_resize((10, 10), (65537, 256))
    with pytest.raises(ItemInputError):
        check_resize((10, 10), (4, 4), max_pixels=15)


def test_short_side_size_is_torchvisions():
    """The size checked is the size torchvision's Resize(256) then produces."""
    from torchvision.transforms import functional as F

    rng = random.Random(5)
    sizes = [(1, 1), (256, 256), (257, 256), (800, 7), (7, 800), (1920, 1080), (1080, 1920), (640, 427)]
    sizes += [(rng.randint(100, 1500), rng.randint(100, 1500)) for _ in range(200)]
    for width, height in sizes:
        assert short_side_size(width, height, 256) == F.resize(Image.new("L", (width, height)), [256]).size


# -- more than 8 bits per sample -----------------------------------------------------------------


def encoded(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_a_16_bit_greyscale_image_reaches_the_model_as_its_8_bit_picture(fmt):
    """Pillow's convert("RGB") clipped every 16-bit value above 255 to white: a photograph came out black and
    white, and the model answered for that. Now the top 8 bits of each sample: the same picture as 8 bits."""
    picture = np.random.default_rng(3).integers(0, 256, (24, 40), dtype=np.uint8)
    wide = Image.fromarray(picture.astype(np.uint16) * 257)  # the same picture, 16 bits per sample
    assert wide.mode == "I;16"
    image = open_image(encoded(wide, fmt), MAX_PIXELS)
    assert image.mode == "L" and image.size == (40, 24)
    assert np.array_equal(np.asarray(image.convert("RGB"))[..., 0], picture)
    ramp = Image.fromarray(np.arange(0, 65536, 256, dtype=np.uint16)[None, :].repeat(2, 0))
    assert np.asarray(open_image(encoded(ramp, fmt), MAX_PIXELS).convert("RGB"))[0, :, 0].tolist() == list(range(256))


def test_a_float_image_is_read_as_0_to_1_or_else_as_0_to_255():
    unit = Image.fromarray(np.linspace(0.0, 1.0, 256, dtype=np.float32)[None, :])
    assert np.asarray(open_image(encoded(unit, "TIFF"), MAX_PIXELS))[0].tolist() == list(range(256))
    wide = Image.fromarray(np.array([[-5.0, 0.0, 100.4, 255.0, 300.0, np.nan]], dtype=np.float32))
    assert np.asarray(open_image(encoded(wide, "TIFF"), MAX_PIXELS))[0].tolist() == [0, 0, 100, 255, 255, 0]


def test_8_bit_images_are_returned_as_they_are():
    data = encoded(noise(40, 24), "PNG")
    image = open_image(data, MAX_PIXELS)
    assert image.mode == "RGB" and image.format == "PNG"  # the same lazily opened image, not a copy


def test_a_16_bit_image_cut_short_fails_its_item_with_status_5():
    """Its pixels are read here (the 8-bit conversion): a truncated file is the item's INVALID_IMAGE, not a 500."""
    wide = Image.fromarray(np.random.default_rng(1).integers(0, 65535, (64, 64), dtype=np.uint16))
    data = encoded(wide, "PNG")
    with pytest.raises(ItemInputError) as caught:
        open_image(data[: len(data) // 2], MAX_PIXELS)
    assert caught.value.status == st.INVALID_IMAGE
    assert caught.value.message == "image cannot be read: image file is truncated"
