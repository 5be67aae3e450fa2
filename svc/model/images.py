"""Per-item input decoding: base64 text to bytes to a lazily opened image.

Runs in the decode thread pool (or the inference thread with
``decode_in_worker``).  A bad item raises :class:`ItemInputError` with its
own status (3 for an empty image, 5 for anything undecodable) and never
affects the other items of the request.

The image reaches a model upright: an EXIF orientation tag is applied here,
once, for every model; and with 8 bits per sample: a 16-bit greyscale PNG or
TIFF is scaled down here (:func:`eight_bit`), where the plugins'
``convert("RGB")`` would clip every value above 255 to white.  Model plugins check every resize with
:func:`check_resize` before any pixel is allocated: the input's pixel count
says little about the cost (a PNG of about 100 bytes and 8000x1 pixels,
resized to a short side of 256, is 2 million by 256 pixels), so the size a
resize would produce is what is bounded.
"""

from __future__ import annotations

import base64
import binascii
import re
import warnings
from io import BytesIO
from typing import Any

from svc.contract import status as st
from svc.contract.status import Status


class ItemInputError(Exception):
    """One input item cannot be used; carries the item status."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def decode_base64(text: str) -> bytes:
    """Standard base64 (padding optional, lines wrapped as the ``base64`` command and MIME wrap them), or a
    ``data:...;base64,`` URL."""
    sent = text
    start = len(text) - len(text.lstrip())  # where the base64 begins in what was sent
    text = text.strip()
    if text[:5].lower() == "data:":  # a URL's scheme is case-insensitive, and so is its ";base64"
        head, sep, text = text.partition(",")
        if not sep or not head.lower().endswith(";base64"):
            raise ItemInputError(st.INVALID_IMAGE, "a data URL must be base64-encoded (data:<type>;base64,<data>)")
        start += len(head) + 1 + len(text) - len(text.lstrip())
        text = text.strip()
    wrapped = "\n" in text or "\r" in text  # wrapped lines: `base64 photo.jpg` wraps at 76 characters
    if wrapped:
        text = "".join(text.split())
    missing = -len(text) % 4
    try:
        if missing == 3:
            raise ValueError("wrong length")
        return base64.b64decode(text + "=" * missing, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ItemInputError(st.INVALID_IMAGE, f"not valid base64: {_stray(sent, start, wrapped) or e}") from None


#: By whether line breaks (any whitespace) were dropped: a character base64 does not have, and padding followed by
#: more data.  Searched in C, over what was sent: an image of megabytes is not walked in Python.
_STRAY = {wrapped: (re.compile(rf"[^A-Za-z0-9+/={space}]"), re.compile(rf"=[={space}]*[A-Za-z0-9+/]"))
          for wrapped, space in ((False, ""), (True, r"\s"))}


def _stray(sent: str, start: int, wrapped: bool) -> str | None:
    """What is wrong with the base64 that begins at ``start`` of ``sent`` (which did not decode), in words, when a
    character is, at its place in ``sent``: looked for only then, so valid images pay nothing (binascii said "wrong
    length" for one stray character).  ``wrapped``: its whitespace was dropped as line breaks."""
    end = len(sent.rstrip())
    bad, padding = (pattern.search(sent, start, end) for pattern in _STRAY[wrapped])
    if padding is not None and (bad is None or padding.start() < bad.start()):
        return f"'=' padding at character {padding.start()}, before the end"
    if bad is None:
        return None
    char, hint = bad.group(), " (the URL-safe alphabet: use '+' and '/')" if bad.group() in "-_" else ""
    return f"{char!a} at character {bad.start()} is not in the base64 alphabet (A-Z, a-z, 0-9, '+', '/'){hint}"


def open_image(data: bytes, max_pixels: int) -> Any:
    """A PIL image, upright, of at most ``max_pixels`` pixels.

    Lazily opened (header read, pixels not yet decoded, so that a model may
    still ask for a reduced-scale JPEG decode with ``draft``) unless the
    image carries an EXIF orientation other than 1: then it is decoded and
    transposed here, so that every model sees what a viewer shows.
    """
    return finish_image(peek_image(data, max_pixels))


#: The formats a client's image may be in: Pillow's raster formats that it decodes in this process.  Not every
#: format Pillow opens: its EPS reader runs Ghostscript (an external interpreter, with a history of sandbox escapes)
#: on the PostScript a client sent, and the rest are formats of other fields (FITS, GRIB, HDF5, MPEG, WMF, ...).
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "DIB", "TIFF", "AVIF", "JPEG2000", "PPM", "TGA", "ICO", "QOI")
#: How the error names them.
FORMAT_NAMES = "JPEG, PNG, WebP, GIF, BMP, TIFF, AVIF, JPEG 2000, PNM, TGA, ICO or QOI"


def peek_image(data: bytes, max_pixels: int) -> Any:
    """The image of ``data`` opened from its header alone, no pixel decoded: what :func:`open_image` checks first.

    Cheap whatever the image's size (reading a PNG's EXIF orientation, in
    :func:`finish_image`, decodes every pixel: 1.2 s for 6000x6000), so the
    server peeks at every item of a batch before it decodes any, and an
    item that is not an image fails at once instead of after its
    neighbours' decoding (past the deadline, it was reported as timed out).
    """
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ItemInputError(st.IMAGE_EMPTY, "input image is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as e:  # far past max_image_pixels: say so, as for any image too large
        raise ItemInputError(st.INVALID_IMAGE, f"image is too large ({e}); at most {max_pixels} pixels are accepted "
                                               "(max_image_pixels)") from None
    except UnidentifiedImageError:
        raise ItemInputError(st.INVALID_IMAGE, f"not a decodable image ({FORMAT_NAMES})") from None
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - the client's bytes: whatever a format's plugin raises (AVIF's
        # RuntimeError was a 500) says that the image cannot be read
        raise ItemInputError(st.INVALID_IMAGE, f"image cannot be read: {_reason(e)}") from None
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ItemInputError(st.INVALID_IMAGE, f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ItemInputError(
            st.INVALID_IMAGE,
            f"image is {width}x{height} = {width * height} pixels; at most {max_pixels} are accepted (max_image_pixels)",
        )
    return image


def finish_image(image: Any) -> Any:
    """A peeked image (:func:`peek_image`) upright and with 8 bits per sample, as models get it."""
    try:
        return eight_bit(upright(image))  # an orientation other than 1 decodes the pixels here
    except (ItemInputError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - as above: a truncated file with an EXIF orientation
        raise ItemInputError(st.INVALID_IMAGE, f"image cannot be decoded: {_reason(e)}") from None


def _reason(error: Exception) -> str:
    """Pillow's message, named by its type where that is not an OSError or ValueError (a plugin's own)."""
    return str(error) if isinstance(error, (OSError, ValueError, SyntaxError)) else f"{type(error).__name__}: {error}"


#: Pillow's single-band modes of more than 8 bits: 16-bit unsigned (I;16 and its byte orders), 32-bit signed
#: (what older Pillows made of a 16-bit PNG), 32-bit float.
_WIDE_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I", "F"})


def eight_bit(image: Any) -> Any:
    """``image`` as 8-bit greyscale (mode ``L``) when its one band has more than 8 bits, else as it is.

    Pillow converts such an image to RGB by clipping: a 16-bit greyscale
    photograph came out white wherever it was not black, and a model
    answered for that, without a word.  Integers are read as 16-bit samples
    (0..65535: their top 8 bits); floats as 0..1 when every value is within
    it, else as 0..255.  Anything outside is clipped.
    """
    if image.mode not in _WIDE_MODES:
        return image
    import numpy as np
    from PIL import Image

    try:
        values = np.asarray(image)
    except (OSError, ValueError, SyntaxError) as e:
        raise ItemInputError(st.INVALID_IMAGE, f"image cannot be read: {e}") from None
    if image.mode == "F":
        finite = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
        scale = 255.0 if finite.size and finite.min() >= 0.0 and finite.max() <= 1.0 else 1.0
        eight = np.clip(np.rint(finite * scale), 0, 255)
    else:
        eight = np.clip(values.astype(np.int64), 0, 65535) >> 8
    return Image.fromarray(eight.astype(np.uint8))  # 2-D uint8: mode L


#: EXIF orientations that need a transpose (1 is upright; other values are invalid and ignored).
_TRANSPOSED_ORIENTATIONS = frozenset(range(2, 9))


def upright(image: Any) -> Any:
    """``image`` with its EXIF orientation applied (``ImageOps.exif_transpose``).

    An image without a tag (or with orientation 1) is returned as it is,
    still lazy: reading the tag decodes no JPEG pixels (Pillow does decode a
    PNG, whose eXIf chunk may follow the pixel data).  A tagged image is
    decoded at full scale and transposed, and the tag is dropped so that
    nothing applies it twice.
    """
    from PIL import ExifTags, ImageOps

    try:
        orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
        if orientation not in _TRANSPOSED_ORIENTATIONS:
            return image
        return ImageOps.exif_transpose(image)
    except (OSError, ValueError, SyntaxError, TypeError) as e:
        raise ItemInputError(st.INVALID_IMAGE, f"image cannot be read: {e}") from None


# -- bounded resizing (what model plugins call) ---------------------------------------------

#: The most pixels one resize in a model's preprocessing may produce: a
#: 4096x4096 RGB image is 48 MiB.  For an ImageNet-style resize of the
#: short side to 256 it allows aspect ratios up to 256:1.
MAX_RESIZED_PIXELS = 4096 * 4096


def check_resize(source: tuple[int, int], target: tuple[int, int], max_pixels: int = MAX_RESIZED_PIXELS) -> None:
    """Fail the item (status 5) unless resizing ``source`` to ``target`` is bounded.

    ``source`` and ``target`` are (width, height).  A side that rounds to 0
    pixels (an 8000x1 image fitted into a 640 square) or more than
    ``max_pixels`` in all (the same image with its short side resized to
    256) both mean that the aspect ratio is too extreme for the model's
    preprocessing.  Call it before decoding the pixels, so that a rejected
    item costs nothing.
    """
    width, height = source
    out_w, out_h = target
    if out_w < 1 or out_h < 1:
        raise ItemInputError(
            st.INVALID_IMAGE,
            f"image is {width}x{height}: its aspect ratio is too extreme for this model "
            f"(resized to the model's input it would be {out_w}x{out_h} pixels)",
        )
    if out_w * out_h > max_pixels:
        raise ItemInputError(
            st.INVALID_IMAGE,
            f"image is {width}x{height}: its aspect ratio is too extreme for this model "
            f"(resized to the model's input it would be {out_w}x{out_h} = {out_w * out_h} pixels; "
            f"at most {max_pixels} are allowed)",
        )


def short_side_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) scaled so that the short side is ``short_side``.

    The long side is ``int(short_side * long / short)``, the rounding of
    torchvision's ``Resize(short_side)``, so that a model can check the size
    of that resize (:func:`check_resize`) before running it.
    """
    if width <= height:
        return short_side, int(short_side * height / width)
    return int(short_side * width / height), short_side


def crop_box(width: int, height: int, resize: int, crop: int) -> tuple[float, float, float, float]:
    """The region of a ``width`` x ``height`` image that torchvision's ``Resize(resize)`` + ``CenterCrop(crop)`` keep.

    In source pixels, as Pillow's ``Image.resize(..., box=)`` takes it:
    resizing that region to ``crop`` x ``crop`` samples the same points with
    the same filter as resizing the whole image (the short side to
    ``resize``, the long side as torchvision rounds it) and cropping its
    centre (the offsets rounded as ``CenterCrop`` rounds them).
    """
    resized_w, resized_h = short_side_size(width, height, resize)
    left = int(round((resized_w - crop) / 2.0))
    top = int(round((resized_h - crop) / 2.0))
    sx, sy = width / resized_w, height / resized_h
    return left * sx, top * sy, (left + crop) * sx, (top + crop) * sy


def vectorised_resize() -> bool:
    """Whether torch resizes uint8 images here with its vectorised antialiased kernel (x86 with AVX2 or AVX-512).

    That kernel runs on the calling thread alone; elsewhere torch's generic
    kernel splits a resize over OpenMP threads, which a decode thread must
    not start (``IModel.preprocess``).
    """
    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def resize_center_crop(image: Any, resize: int, crop: int, interpolation: Any, vectorised: bool | None = None) -> Any:
    """torchvision's ``Resize(resize)`` + ``CenterCrop(crop)`` (antialiased) of a Pillow image: uint8 HWC pixels.

    Pillow decodes; the resize runs in torch's vectorised uint8 kernel where
    the CPU has it (``vectorised``, by default :func:`vectorised_resize`), on
    the whole image as torchvision resizes a tensor, in about a third of
    Pillow's time (bench/README.md, ``bench.jpeg_decode``); elsewhere Pillow
    resizes only the region that the crop keeps (:func:`crop_box`).  Both
    give torchvision's pixels on a Pillow image up to one level of rounding
    (``tests/unit/test_mobilenetv2_preprocess.py``).  Only ``BILINEAR`` has
    the vectorised kernel; other filters take Pillow's path.  Check the
    resize (:func:`check_resize`) before calling this: it decodes the image.
    """
    import numpy as np
    from torchvision.transforms import InterpolationMode

    rgb = image if image.mode == "RGB" else image.convert("RGB")
    if vectorised is None:
        vectorised = interpolation == InterpolationMode.BILINEAR and vectorised_resize()
    if not vectorised:
        from PIL import Image

        box = crop_box(rgb.width, rgb.height, resize, crop)
        return np.asarray(rgb.resize((crop, crop), getattr(Image.Resampling, interpolation.value.upper()), box=box))
    import torch
    from torchvision.transforms.v2 import functional as F

    pixels = torch.from_numpy(np.array(rgb)).permute(2, 0, 1)  # CHW over the decoded HWC pixels, no copy
    resized = F.resize(pixels, [resize], interpolation=interpolation, antialias=True)
    return F.center_crop(resized, [crop]).permute(1, 2, 0).numpy()
