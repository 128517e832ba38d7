"""Tools that return images: a real MCP stdio server sending two ImageContent blocks and text, Python
tools returning PIL images, PNG/JPEG bytes, numpy arrays or mixed lists, the result cache, and
hostile images (not an image, a decompression bomb, a bad array)."""

from __future__ import annotations

import asyncio
import io
import struct
import zlib

import numpy as np
import pytest
from conftest import server
from PIL import Image as PILImage

from rlfactory.images import MAX_PIXELS, ImageError, image_from_bytes, image_from_value
from rlfactory.tools import OK, ResultCache, ToolCall, ToolResult, ToolRunner, function_tool
from rlfactory.tools.cache import MAX_IMAGE_BYTES
from rlfactory.tools.servers.pictures import COLORS, picture_png


def _png(color=(10, 20, 30), size=(5, 4), fmt="PNG") -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def test_a_real_mcp_server_returns_two_images_and_text_kept_in_order():
    async def main():
        async with ToolRunner(mcp={"mcpServers": {"pics": server("pictures")}}) as r:
            return await r.call(ToolCall("pictures", {"count": 2, "size": 16}))

    res = asyncio.run(main())
    assert res.status == OK and not res.is_error
    assert res.text.split("\n") == ["2 pictures of 16x16 pixels", "[image image/png]", "[image image/png]"]
    assert [im.mime for im in res.images] == ["image/png", "image/png"]
    assert [im.data for im in res.images] == [picture_png(0, 16), picture_png(1, 16)]  # the bytes sent, in order
    assert [(im.width, im.height) for im in res.images] == [(16, 16), (16, 16)]
    assert [im.to_pil().getpixel((15, 15)) for im in res.images] == [COLORS[0], COLORS[1]]
    assert len({im.sha256 for im in res.images}) == 2


def test_the_result_cache_keeps_images_across_restarts(tmp_path):
    im = image_from_bytes(_png())
    result = ToolResult("[image image/png]", images=[im, image_from_bytes(_png((1, 2, 3)))])
    cache = ResultCache(path=str(tmp_path / "c.sqlite"))
    cache.put("t", "{}", result)
    cache.close()
    again = ResultCache(path=str(tmp_path / "c.sqlite")).get("t", "{}")
    assert again is not None and again.images == result.images and again.text == result.text
    # Results heavy with images are not remembered (memory), in memory or on disk.
    noise = np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)
    heavy = ToolResult("[image image/png]", images=[image_from_value(noise)])
    assert len(heavy.images[0].data) > MAX_IMAGE_BYTES
    cache = ResultCache(path=str(tmp_path / "c.sqlite"))
    cache.put("t", "heavy", heavy)
    assert cache.get("t", "heavy") is None and ResultCache(path=str(tmp_path / "c.sqlite")).get("t", "heavy") is None


@pytest.mark.parametrize("kind", ["pil", "png", "jpeg", "uint8", "float", "gray", "list"])
def test_python_tools_may_return_pictures(kind):
    red = np.zeros((6, 8, 3), np.uint8)
    red[..., 0] = 255
    values = {
        "pil": lambda: PILImage.fromarray(red),
        "png": lambda: _png((255, 0, 0), (8, 6)),
        "jpeg": lambda: _png((255, 0, 0), (8, 6), "JPEG"),
        "uint8": lambda: red,
        "float": lambda: red.astype(np.float32) / 255.0,
        "gray": lambda: np.full((6, 8), 255, np.uint8),
        "list": lambda: ["before", PILImage.fromarray(red), "between", _png((0, 0, 255), (8, 6))],
    }

    def look() -> object:
        """Return a picture."""
        return values[kind]()

    res = asyncio.run(function_tool(look).call({}))
    assert res.status == OK and not res.is_error, res.text
    assert all((im.width, im.height) == (8, 6) for im in res.images)
    if kind == "list":
        assert res.text.split("\n") == ["before", "[image image/png]", "between", "[image image/png]"]
        assert [im.to_pil().getpixel((0, 0)) for im in res.images] == [(255, 0, 0), (0, 0, 255)]
        return
    (im,) = res.images
    assert res.text == f"[image {im.mime}]"
    assert im.mime == ("image/jpeg" if kind == "jpeg" else "image/png")
    r, g, b = im.to_pil().getpixel((3, 3))
    assert (r, g, b) == (255, 255, 255) if kind == "gray" else r > 240 and g < 15 and b < 15


def _bomb() -> bytes:
    """A valid PNG whose header says 100000x100000 pixels (a few hundred bytes on disk)."""
    raw = zlib.compress(b"\x00" * 64)
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


@pytest.mark.parametrize("value, why", [
    (b"\x89PNG\r\n\x1a\nnot really", "cannot"),
    (b"plain bytes", "not an image Pillow can read"),
    (_bomb(), f"larger than the {MAX_PIXELS}"),
    (np.zeros((4, 4, 2), np.uint8), "is not an image: use (H, W)"),
    (np.full((4, 4), np.nan), "NaN"),
    (["text", PILImage.new("RGB", (2, 2)), 42], "part 3 of the result): a int is not an image"),
])
def test_a_returned_picture_that_cannot_be_shown_is_one_error_line(value, why):
    def look() -> object:
        """Return something."""
        return value

    res = asyncio.run(function_tool(look).call({}))
    assert res.is_error and res.images == [] and why in res.text and "\n" not in res.text
    assert res.text.startswith("the tool returned an image that cannot be shown")


def test_image_values_from_rows_data_urls_and_files(tmp_path):
    import base64

    png = _png()
    (tmp_path / "a.png").write_bytes(png)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    for value in (url, {"type": "image", "image": "a.png"}, {"type": "image_url", "image_url": {"url": url}}):
        assert image_from_value(value, tmp_path).data == png
    with pytest.raises(ImageError, match="URLs are not fetched"):
        image_from_value("https://example.com/a.png")
    with pytest.raises(ImageError, match="cannot read image file"):
        image_from_value("missing.png", tmp_path)
    with pytest.raises(ImageError, match="not valid base64"):
        image_from_value("data:image/png;base64,@@@")


def test_hostile_image_paths_are_one_line_each(tmp_path):
    (tmp_path / "dir.png").mkdir()
    with open(tmp_path / "huge.png", "wb") as f:  # sparse: 33 MB on paper, nothing on disk
        f.truncate(33 * 1024 * 1024)
    (tmp_path / "secret.txt").write_text("not a picture\n")
    (tmp_path / "link.png").symlink_to(tmp_path / "secret.txt")
    for name, why in (("dir.png", "cannot read image file"), ("huge.png", "is larger than the"),
                      ("link.png", "not an image Pillow can read")):
        with pytest.raises(ImageError, match=why) as e:
            image_from_value(name, tmp_path)
        assert "\n" not in str(e.value)
