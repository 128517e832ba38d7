"""A unit-conversion MCP server, written the way a third party would write one (mcp 2.x).

    python units_server.py        # speaks MCP over stdio; mcp.json starts it this way

One tool, `convert(value, from_unit, to_unit)`. A bad unit is an error result whose message the
model sees (raised as ToolError: the SDK hides the message of any other exception).
"""

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from unitconv import convert_text

server = MCPServer("units", log_level="WARNING")


@server.tool(structured_output=False)
async def convert(value: Annotated[float, Field(description="The amount.")],
                  from_unit: Annotated[str, Field(description="Its unit.")],
                  to_unit: Annotated[str, Field(description="The unit wanted.")]) -> str:
    """Convert an amount between units."""
    try:
        return convert_text(value, from_unit, to_unit)
    except ValueError as e:
        # ToolError's message reaches the model; any other exception reads only "Error executing tool convert"
        raise ToolError(str(e)) from e


if __name__ == "__main__":
    server.run("stdio")
