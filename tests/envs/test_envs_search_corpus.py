"""BM25 over a corpus of the user's own: in process (`BM25Corpus`, a tool in two lines) and as a
real MCP server process (`python -m rlfactory.envs.search.mcp_server --corpus`)."""

from __future__ import annotations

import asyncio
import json

from rlfactory.envs.search.bm25 import BM25Corpus, BM25Index
from rlfactory.tools import ToolCall, ToolRunner
from rlfactory.tools.function import FunctionTool

DOCS = [{"id": "0", "contents": "Hessvik\nHessvik is a port founded by Ada Morrow."},
        {"id": "1", "contents": "Tallon\nTallon is a mountain town known for copper."},
        {"id": "2", "contents": "Ada Morrow\nAda Morrow was a sailor born in Tallon."}]


def test_search_text_and_tool_agree_with_the_index(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    corpus = BM25Corpus.from_jsonl(path)
    query = "who founded the port Hessvik"
    best = [i for i, _ in BM25Index([d["contents"] for d in DOCS]).search(query, 2)]
    assert [d["id"] for d in corpus.search(query, 2)] == [DOCS[i]["id"] for i in best] == ["0", "1"]
    text = corpus.search_text(query, 2)
    assert text == ("Doc 1(Title: Hessvik) Hessvik is a port founded by Ada Morrow.\n"
                    "Doc 2(Title: Tallon) Tallon is a mountain town known for copper.\n")
    tool = corpus.as_tool(topk=2)
    assert isinstance(tool, FunctionTool) and tool.name == "search"
    assert tool.parameters["properties"]["query"]["type"] == "string"
    assert tool.parameters["properties"]["query"]["description"]
    assert asyncio.run(tool.call({"query": query})).text == text


def test_the_mcp_server_searches_a_corpus_itself(tmp_path):
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    mcp = tmp_path / "mcp.json"  # a relative --corpus, taken from the MCP config's folder
    mcp.write_text(json.dumps({"mcpServers": {"wiki": {"command": "python", "args": [
        "-m", "rlfactory.envs.search.mcp_server", "--corpus", "corpus.jsonl", "--topk", "2"]}}}))

    async def main():
        async with ToolRunner(mcp=str(mcp)) as runner:
            (spec,) = runner.specs()
            result = await runner.call(ToolCall("search", {"query": "copper town"}))
        return spec, result

    spec, result = asyncio.run(main())
    assert spec.name == "search" and spec.parameters["properties"]["query"]["description"]
    assert not result.is_error
    assert result.text == BM25Corpus(DOCS).search_text("copper town", 2)
