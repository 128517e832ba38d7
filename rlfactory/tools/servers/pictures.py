"""Pictures MCP server: tools whose results hold images, for tests and the images demo.

`pictures` returns a line of text and `count` small PNG images (MCP `ImageContent` blocks), each a
different colour with its index drawn as that many white squares, so a test can tell them apart
and check their order.
"""

from __future__ import annotations

import io
from typing import Annotated

from mcp.server.mcpserver import Image, MCPServer
from pydantic import Field

from rlfactory.tools.servers._serve import serve

server = MCPServer("pictures", log_level="WARNING")
COLORS = [(200, 30, 30), (30, 160, 40), (40, 60, 210), (220, 190, 20), (150, 40, 170), (20, 170, 170)]


def picture_png(index: int, size: int) -> bytes:
    """PNG bytes of picture `index` (0-based): its colour, and index + 1 white squares on a row."""
    from PIL import Image as PILImage, ImageDraw

    im = PILImage.new("RGB", (size, size), COLORS[index % len(COLORS)])
    draw = ImageDraw.Draw(im)
    side = max(1, size // 8)
    for k in range(index + 1):
        x = (k * 2 * side) % max(1, size - side)
        draw.rectangle([x, side, x + side - 1, 2 * side - 1], fill=(255, 255, 255))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


@server.tool()
async def pictures(
    count: Annotated[int, Field(description="How many pictures.", ge=0, le=16)] = 2,
    size: Annotated[int, Field(description="Side of each square picture in pixels.", ge=1, le=1024)] = 32,
) -> list[str | Image]:
    """Return a line of text, then `count` square pictures of `size` pixels."""
    return [f"{count} pictures of {size}x{size} pixels"] + [Image(data=picture_png(i, size), format="png")
                                                            for i in range(count)]


if __name__ == "__main__":
    serve(server)
