"""An MCP server written against the wire (JSON-RPC lines on stdin/stdout), for client tests.

It does what SDK servers rarely do on demand: pages its tool list, asks the client `ping` and an
unsupported request mid-call, sends notifications, answers out of order, returns every content
kind and a kind no client knows, breaks its output schema, answers with a JSON-RPC error, sends an
answer of any size with its id last (as the TypeScript SDK orders keys), and records cancellations.
"""

import asyncio
import json
import os
import sys

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}, "delay": {"type": "number"}}}
PAGES = [
    [
        {"name": "echo_back", "description": "Answer `text` after `delay` seconds.", "inputSchema": SCHEMA},
        {"name": "handshake", "description": "What the client said at initialize.", "inputSchema": {"type": "object"}},
        {"name": "ask_client", "description": "Ask the client ping and roots/list.", "inputSchema": {"type": "object"}},
    ],
    [
        {"name": "rich", "description": "Every content kind.", "inputSchema": {"type": "object"}},
        {
            "name": "bad_output",
            "description": "Breaks its output schema.",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        },
        {"name": "rpc_error", "description": "Answers with a JSON-RPC error.", "inputSchema": {"type": "object"}},
        {"name": "slow", "description": "Never answers.", "inputSchema": {"type": "object"}},
        {"name": "cancelled", "description": "Request ids cancelled so far.", "inputSchema": {"type": "object"}},
        {"name": "mixed", "description": "A text block and a kind of block no client knows.", "inputSchema": {"type": "object"}},
        {"name": "flood", "description": "A text of `size` bytes, id last.", "inputSchema": {"type": "object"}},
        {"name": "deep", "description": "An answer nested `depth` levels deep.", "inputSchema": {"type": "object"}},
        {"name": "bad_utf8", "description": "A text with bytes that are not UTF-8.", "inputSchema": {"type": "object"}},
        {"name": "garbled", "description": "An answer that is not JSON, its id first.", "inputSchema": {"type": "object"}},
        {"name": "surrogate", "description": "A text with a lone surrogate escape.", "inputSchema": {"type": "object"}},
    ],
]


class WireServer:
    def __init__(self, writer):
        self.writer = writer
        self.init_params = None
        self.initialized = False
        self.cancelled = []
        self.waiting = {}  # our request id -> future of the client's answer
        self.running = {}

    def send(self, msg):
        self.writer.write(json.dumps(msg).encode() + b"\n")

    def reply(self, rid, result):
        self.send({"jsonrpc": "2.0", "id": rid, "result": result})

    async def ask(self, rid, method):
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        self.send({"jsonrpc": "2.0", "id": rid, "method": method})
        return await fut

    async def call(self, rid, name, args):
        text = lambda t: {"content": [{"type": "text", "text": t}], "isError": False}  # noqa: E731
        if name == "echo_back":
            await asyncio.sleep(args.get("delay", 0))
            self.reply(rid, text(args.get("text", "")))
        elif name == "handshake":
            self.reply(rid, text(json.dumps({"params": self.init_params, "initialized": self.initialized})))
        elif name == "ask_client":
            self.send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hello"}})
            self.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 0.5}})
            pong, roots = await asyncio.gather(self.ask("srv-1", "ping"), self.ask("srv-2", "roots/list"))
            self.reply(rid, text(json.dumps({"ping": pong, "roots": roots})))
        elif name == "rich":
            self.reply(rid, {
                "content": [
                    {"type": "text", "text": "first"},
                    {"type": "image", "data": "aW1n", "mimeType": "image/png"},
                    {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "inside"}},
                    {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAEC"}},
                    {"type": "resource_link", "uri": "file:///c.txt", "name": "c"},
                ],
                "structuredContent": {"n": 1},
            })
        elif name == "bad_output":
            self.reply(rid, {"content": [{"type": "text", "text": "x"}], "structuredContent": {"n": "x"}})
        elif name == "rpc_error":
            self.send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "bad things happened"}})
        elif name == "slow":
            await asyncio.sleep(3600)
        elif name == "cancelled":
            self.reply(rid, text(json.dumps(self.cancelled)))
        elif name == "mixed":
            self.reply(rid, {"content": [
                {"type": "text", "text": "the valid part"},
                {"type": "hologram", "frames": ["x" * 100] * 20},
                {"type": "text", "text": "after it"},
            ]})
        elif name == "deep":  # a hostile server: 2 bytes per level
            n = args.get("depth", 100_000)
            head = '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"x"}],"structuredContent":{"a":'
            self.writer.write((head % json.dumps(rid) + "[" * n + "]" * n + "}}}\n").encode())
        elif name == "bad_utf8":
            self.writer.write(b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode()
                              + b',"result":{"content":[{"type":"text","text":"caf\xc3\xa9 \xff\xfe \xc3 end"}]}}\n')
        elif name == "garbled":
            self.writer.write(b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode() + b',"result":{"content":[oops\n')
        elif name == "surrogate":  # what a server reading a corpus with half an emoji sends
            self.writer.write(b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode()
                              + b',"result":{"content":[{"type":"text","text":"half \\ud83d here"}]}}\n')
        elif name == "flood":
            body = {"content": [{"type": "text", "text": "y" * args.get("size", 10)}], "isError": False}
            self.writer.write(json.dumps({"result": body, "jsonrpc": "2.0", "id": rid}).encode() + b"\n")

    def on_message(self, msg):
        method, rid = msg.get("method"), msg.get("id")
        if method is None:  # the client's answer to one of our requests
            fut = self.waiting.pop(rid, None)
            if fut is not None:
                fut.set_result(msg)
        elif method == "initialize":
            self.init_params = msg["params"]
            info = {"name": "wire", "version": "1"}
            self.reply(rid, {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": info})
        elif method == "ping":
            self.reply(rid, {})
        elif method == "notifications/initialized":
            self.initialized = True
        elif method == "notifications/cancelled":
            self.cancelled.append(msg["params"]["requestId"])
            task = self.running.pop(msg["params"]["requestId"], None)
            if task is not None:
                task.cancel()
        elif method == "tools/list":
            cursor = (msg.get("params") or {}).get("cursor")
            page = 1 if cursor == "page-2" else 0
            self.reply(rid, {"tools": PAGES[page], **({"nextCursor": "page-2"} if page == 0 else {})})
        elif method == "tools/call":
            p = msg["params"]
            self.running[rid] = asyncio.ensure_future(self.call(rid, p["name"], p.get("arguments") or {}))
        elif rid is not None:
            self.send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})


async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", 0))
    server = WireServer(asyncio.StreamWriter(transport, protocol, None, loop))
    while line := await reader.readline():
        server.on_message(json.loads(line))


if __name__ == "__main__":
    asyncio.run(main())
