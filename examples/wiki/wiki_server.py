"""The wiki's search tool as an MCP server (mcp 2.x: `MCPServer` is FastMCP's new home).

mcp.json starts it as `python wiki_server.py`: `python` is the interpreter rlfactory runs under,
and the server runs in mcp.json's folder, so relative paths (this script, corpus.jsonl) are taken
from there. The SDK builds the parameter schema from the type hints but does not read an `Args:`
docstring section, so a parameter's description goes in `Field(description=...)`.
"""

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

from rlfactory.envs.search.bm25 import BM25Corpus

corpus = BM25Corpus.from_jsonl("corpus.jsonl")
server = MCPServer("wiki", log_level="WARNING")


@server.tool(structured_output=False)
async def search(query: Annotated[str, Field(description="What to look up, e.g. a name from the question.")]) -> str:
    """Search the corpus and return the top passages."""
    return corpus.search_text(query, k=2)


if __name__ == "__main__":
    server.run("stdio")
