"""Images as data: what a tool returns, what a prompt or an observation shows, what a trajectory keeps.

An `Image` is its encoded bytes (PNG or JPEG), its MIME type, its size and the SHA-256 of the
bytes, which names it everywhere (the run's `images/<sha256>.<ext>` file, a trajectory line's
reference). Everything outside (a tool's PIL image, numpy array or bytes; an MCP `ImageContent`'s
base64; a dataset row's data URL or file) becomes one through `image_from_value`, which decodes
the picture once to check it: a value that is not a readable image is a `ImageError` with one line
saying why, never a half-kept picture.

This module sits at the bottom beside `rlfactory.trajectory` and imports nothing of rlfactory.
Pillow is imported only when an image is made or decoded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_PIXELS = 4096 * 4096
"""Larger pictures are refused (a decompression bomb is a few KB of PNG for gigabytes of pixels)."""
MAX_BYTES = 32 * 1024 * 1024
"""Larger encoded images are refused before they are decoded."""
_EXT = {"image/png": "png", "image/jpeg": "jpg"}
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"))


class ImageError(ValueError):
    """A value that cannot be an image; the message is one line saying why."""


@dataclass(frozen=True)
class Image:
    """One picture. `data` is None only for a reference read from a trajectory line without its
    image folder (`resolve` loads it); `sha256` always names the bytes."""

    sha256: str
    mime: str
    width: int
    height: int
    data: bytes | None = None

    @property
    def ext(self) -> str:
        return _EXT.get(self.mime, "bin")

    def ref(self) -> dict[str, Any]:
        """What a trajectory line stores: everything but the bytes."""
        return {"sha256": self.sha256, "mime": self.mime, "width": self.width, "height": self.height}

    @classmethod
    def from_ref(cls, ref: dict[str, Any]) -> "Image":
        try:
            return cls(str(ref["sha256"]), str(ref["mime"]), int(ref["width"]), int(ref["height"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ImageError(f"bad image reference {str(ref)[:120]}: {e}") from None

    def file_name(self) -> str:
        return f"{self.sha256}.{self.ext}"

    def resolve(self, folder: str | Path) -> "Image":
        """This image with its bytes, read from `folder/<sha256>.<ext>` and checked against the hash."""
        if self.data is not None:
            return self
        path = Path(folder) / self.file_name()
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ImageError(f"image {self.sha256[:12]} is missing: cannot read {path}: {e.strerror}") from None
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise ImageError(f"image file {path} does not hold the image {self.sha256[:12]} (its hash differs)")
        return Image(self.sha256, self.mime, self.width, self.height, data)

    def save(self, folder: str | Path) -> Path:
        """Write the bytes to `folder/<sha256>.<ext>` once (atomically; an existing file is kept)."""
        if self.data is None:
            raise ImageError(f"image {self.sha256[:12]} has no bytes to save (a reference only)")
        folder = Path(folder)
        path = folder / self.file_name()
        if path.exists():
            return path
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.sha256[:12]}.", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self.data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    def to_pil(self) -> Any:
        """The decoded picture as an RGB `PIL.Image.Image`."""
        if self.data is None:
            raise ImageError(f"image {self.sha256[:12]} has no bytes (a reference only); resolve it first")
        from PIL import Image as PILImage

        with PILImage.open(io.BytesIO(self.data)) as im:
            return im.convert("RGB")

    def note(self) -> str:
        """The short text a model without eyes reads in its place."""
        return f"[image {self.mime}]"


def image_from_bytes(data: bytes, mime: str | None = None) -> Image:
    """A PNG or JPEG image of `data` (checked by decoding it); another format Pillow reads (GIF,
    WebP, BMP, ...) is re-encoded as PNG. `mime` is what the sender said; the bytes decide."""
    if len(data) > MAX_BYTES:
        raise ImageError(f"an image of {len(data)} bytes is larger than the {MAX_BYTES} allowed")
    sniffed = next((m for magic, m in _MAGIC if data.startswith(magic)), None)
    from PIL import Image as PILImage, UnidentifiedImageError

    said = f" (sent as {mime})" if mime else ""
    try:
        with PILImage.open(io.BytesIO(data)) as im:
            width, height = im.size
            if width * height > MAX_PIXELS:
                raise ImageError(f"an image of {width}x{height} pixels is larger than the {MAX_PIXELS} allowed")
            im.load()  # decodes every pixel: a truncated or corrupt file fails here, not in the processor
            if sniffed is None:
                return _png(im)
    except UnidentifiedImageError:
        raise ImageError(f"{len(data)} bytes{said} are not an image Pillow can read") from None
    except PILImage.DecompressionBombError:  # Pillow's own limit, past ours: refused before decoding
        raise ImageError(f"an image{said} larger than the {MAX_PIXELS} pixels allowed") from None
    except (OSError, SyntaxError, ValueError) as e:
        if isinstance(e, ImageError):
            raise
        raise ImageError(f"cannot decode the image{said}: {str(e)[:200]}") from None
    return Image(hashlib.sha256(data).hexdigest(), sniffed, width, height, bytes(data))


def _png(im: Any) -> Image:
    buf = io.BytesIO()
    im.convert("RGBA" if im.mode in ("RGBA", "LA", "P") else "RGB").save(buf, format="PNG")
    data = buf.getvalue()
    return Image(hashlib.sha256(data).hexdigest(), "image/png", im.size[0], im.size[1], data)


def image_from_pil(im: Any) -> Image:
    """A PIL image, encoded as PNG (lossless)."""
    w, h = im.size
    if w * h > MAX_PIXELS:
        raise ImageError(f"an image of {w}x{h} pixels is larger than the {MAX_PIXELS} allowed")
    return _png(im)


def image_from_array(arr: Any) -> Image:
    """A numpy array of shape (H, W), (H, W, 3) or (H, W, 4): uint8, or floats in [0, 1]."""
    import numpy as np
    from PIL import Image as PILImage

    a = np.asarray(arr)
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (1, 3, 4)) or 0 in a.shape:
        raise ImageError(f"an array of shape {a.shape} is not an image: use (H, W), (H, W, 3) or (H, W, 4)")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.dtype != np.uint8:
        if a.dtype.kind not in "fiub":
            raise ImageError(f"an array of dtype {a.dtype} is not an image: use uint8, or floats in [0, 1]")
        if a.dtype.kind == "f":
            if not np.isfinite(a).all():
                raise ImageError("an image array holds NaN or infinite values")
            a = a * 255.0
        a = np.clip(np.rint(a), 0, 255).astype(np.uint8)
    return image_from_pil(PILImage.fromarray(a))


def image_from_base64(data: str, mime: str | None = None) -> Image:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"image data{f' ({mime})' if mime else ''} is not valid base64") from None
    return image_from_bytes(raw, mime)


def image_from_value(value: Any, base_dir: str | Path | None = None) -> Image:
    """`value` as an Image: an Image, a PIL image, PNG/JPEG bytes, a numpy array, a `data:` URL, a
    dict `{"image": ...}` / `{"image_url": {"url": ...}}` (chat-message parts), or a file path
    (relative to `base_dir`). Raises ImageError naming what it got."""
    if isinstance(value, Image):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return image_from_bytes(bytes(value))
    if isinstance(value, dict):
        inner = value.get("image", value.get("image_url"))
        if isinstance(inner, dict):
            inner = inner.get("url")
        if inner is None:
            raise ImageError(f"an image part needs an `image` or `image_url` field, got keys {sorted(value)[:8]}")
        return image_from_value(inner, base_dir)
    if isinstance(value, str):
        if value.startswith("data:"):
            head, _, payload = value.partition(",")
            if not head.endswith(";base64"):
                raise ImageError("an image data URL must be base64 (data:image/png;base64,...)")
            return image_from_base64(payload, head[5:].split(";")[0] or None)
        if "://" in value:
            raise ImageError(f"image {value[:80]!r}: URLs are not fetched; give a file path or a data URL")
        path = Path(base_dir, value) if base_dir is not None else Path(value)
        try:
            data = path.read_bytes() if path.stat().st_size <= MAX_BYTES else None
        except OSError as e:
            raise ImageError(f"cannot read image file {str(path)[:200]}: {e.strerror}") from None
        if data is None:
            raise ImageError(f"image file {str(path)[:200]} is larger than the {MAX_BYTES} bytes allowed")
        return image_from_bytes(data)
    if hasattr(value, "size") and hasattr(value, "mode") and hasattr(value, "save"):  # a PIL image
        return image_from_pil(value)
    if hasattr(value, "__array__") and hasattr(value, "shape"):
        return image_from_array(value)
    raise ImageError(f"a {type(value).__name__} is not an image (give a PIL image, PNG/JPEG bytes or an array)")


def is_image_value(value: Any) -> bool:
    """Whether a tool's return value is meant as an image (without decoding it)."""
    if isinstance(value, Image):
        return True
    if isinstance(value, (bytes, bytearray)):
        return any(bytes(value[:8]).startswith(m) for m, _ in _MAGIC)
    if hasattr(value, "size") and hasattr(value, "mode") and hasattr(value, "save"):
        return True
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"
