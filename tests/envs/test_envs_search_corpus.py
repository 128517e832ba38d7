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


# Corpus lines as users write them: Search-R1's (id first, json.dumps's spaces, \u escapes), compact,
# without an id (it gets its line number), id not first, a number as id, extra fields, CRLF.
LINES = ['{"id": "0", "contents": "\\"Aaron\\"\\nAaron is a prophet \\u00e9 \\ud83d\\ude00."}',
         '{"id":"1","contents":"Tallon\\nTallon is a town.","url":"x"}',
         '',
         '{"contents": "Hessvik\\nno id here, \\u00fc"}',
         '{"contents": "Ada\\nid comes last", "id": "p4"}',
         '  { "id" : 5 , "contents" : "Five\\nspaces around"}\r',
         '{"id": "6", "contents": "Six\\nthe last line, no newline"}']


def test_a_documents_json_is_its_corpus_line_where_that_names_the_id(tmp_path):
    from rlfactory.envs.search.corpus_store import CorpusStore, scan_corpus

    path = tmp_path / "corpus.jsonl"
    path.write_bytes("\n".join(LINES).encode())  # the last line ends without "\n"
    store = CorpusStore(path, *scan_corpus(path))
    spliced = {0: 0, 1: 1, 4: 5, 5: 6}  # position -> line: the line is the answer as it is
    for i in range(len(store)):
        got = store.json_bytes(i)
        assert list(json.loads(got).items()) == list(store[i].items())  # the same document, keys in order
        if i in spliced:
            assert got == LINES[spliced[i]].strip().encode()
    assert json.loads(store.json_bytes(2)) == {"contents": "Hessvik\nno id here, \u00fc", "id": "3"}


def test_the_retrievers_answer_is_what_json_encoding_the_documents_gave(tmp_path):
    """The answer splices documents' JSON: parsed, it equals the encoding of the documents it
    replaced, for a corpus store and for a list of dicts."""
    import httpx

    from rlfactory.envs.search.corpus_store import CorpusStore, dumps, scan_corpus
    from rlfactory.envs.search.retriever import build_app
    from rlfactory.serve.thread import AppThread

    path = tmp_path / "corpus.jsonl"
    path.write_bytes("\n".join(LINES).encode())
    store = CorpusStore(path, *scan_corpus(path))
    index = BM25Index([d["contents"] for d in store])
    queries = ["Aaron prophet", "town", "Hessvik", "last line", "spaces", "zzz"]
    for docs in (store, list(store)):
        with AppThread(build_app(docs, 3, index)) as srv:
            for scores in (True, False):
                r = httpx.post(srv.url + "/retrieve", json={"queries": queries, "topk": 4, "return_scores": scores})
                assert r.status_code == 200 and r.headers["content-type"] == "application/json"
                want = [[{"document": store[i], "score": s} if scores else store[i] for i, s in index.search(q, 4)]
                        for q in queries]
                assert dumps(json.loads(r.content)) == dumps({"result": want})  # to the byte, key order included
