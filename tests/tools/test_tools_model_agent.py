"""ModelTool (OpenAI-compatible endpoint; local transformers model) and AgentTool."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import server

from rlfactory.config import ToolsConfig
from rlfactory.tools import CRASHED, ERROR, UNKNOWN_TOOL, AgentTool, ModelTool, ToolCall, ToolResult, ToolRunner


class ChatServer:
    """A tiny HTTP server speaking the OpenAI chat-completions shape; fails on request."""

    def __init__(self, fail_first: int = 0, status: int = 500) -> None:
        self.requests: list[dict] = []
        self.fail_left = fail_first
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                if owner.fail_left > 0:
                    owner.fail_left -= 1
                    self._send(status, {"error": {"message": "overloaded" if status >= 500 else "bad request"}})
                    return
                if self.path.endswith("/chat/completions"):
                    last = body["messages"][-1]["content"]
                    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": f"echo: {last}"}}]}
                else:
                    answer = {"choices": [{"index": 0, "text": f"completed: {body['prompt'].strip()}"}]}
                self._send(200, answer)

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server():
    servers = []

    def make(**kw):
        s = ChatServer(**kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def test_model_tool_over_an_openai_compatible_endpoint(chat_server):
    srv = chat_server(fail_first=1, status=503)
    judge = ModelTool(
        "judge",
        "Ask the judge model.",
        base_url=srv.url,
        model="tiny-judge",
        api_key="secret",
        system_prompt="You are terse.",
        max_tokens=16,
    )

    async def main():
        r = ToolRunner([judge], ToolsConfig(retry_backoff_s=0.01))
        res = await r.call(ToolCall("judge", {"prompt": "is 2+2=4?"}))
        assert res.text == "echo: is 2+2=4?" and not res.is_error
        assert len(srv.requests) == 2  # the 503 was a transport failure: retried
        req = srv.requests[-1]
        assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer secret"
        assert req["body"]["model"] == "tiny-judge" and req["body"]["max_tokens"] == 16
        assert req["body"]["messages"] == [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "is 2+2=4?"},
        ]
        bad = await r.call(ToolCall("judge", {"prompt": 3}))  # schema says string
        assert bad.is_error and "is not of type 'string'" in bad.text
        await r.aclose()

    asyncio.run(main())


def test_model_tool_client_errors_are_not_retried_and_completions_api(chat_server):
    srv = chat_server(fail_first=1, status=400)
    tool = ModelTool(base_url=srv.url, api="completions", prompt_template="Q: {prompt}")
    down = ModelTool("down", "unreachable", base_url="http://127.0.0.1:9/v1")

    async def main():
        r = ToolRunner([tool, down], ToolsConfig(retries=1, retry_backoff_s=0.01))
        res = await r.call(ToolCall("ask_model", {"prompt": "x"}))
        assert res.status == ERROR and "HTTP 400" in res.text and len(srv.requests) == 1
        res = await r.call(ToolCall("ask_model", {"prompt": "x"}))
        assert res.text == "completed: Q: x" and srv.requests[-1]["path"] == "/v1/completions"
        gone = await r.call(ToolCall("down", {"prompt": "x"}))
        assert gone.status == CRASHED and "cannot reach" in gone.text
        await r.aclose()

    asyncio.run(main())


def _tiny_local_model():
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["the quick brown fox", "tools answer questions", "what is two plus two"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
    )
    model = Qwen3ForCausalLM(cfg).eval()
    return model, fast


def test_model_tool_with_a_local_transformers_model():
    model, tokenizer = _tiny_local_model()
    tool = ModelTool("local", "A tiny local model.", hf_model=model, tokenizer=tokenizer, max_tokens=5)

    async def main():
        r = ToolRunner([tool])
        a, b = await r.run([ToolCall("local", {"prompt": "what is two plus two"})] * 2)
        assert not a.is_error and a.text == b.text  # greedy: same prompt, same answer
        assert a.text == await tool.complete("what is two plus two")
        # the text is exactly the model's greedy continuation of the prompt, decoded
        ids = tokenizer("what is two plus two\n", return_tensors="pt")
        out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        new = out[0, ids["input_ids"].shape[1] :]
        assert 0 < len(new) <= 5 and a.text == tokenizer.decode(new, skip_special_tokens=True)

    asyncio.run(main())


def test_agent_tool_calls_other_tools_and_a_model(chat_server):
    srv = chat_server()
    model = ModelTool(base_url=srv.url)

    async def solve(args, tools, model_fn):
        total = await tools.call("add", {"a": args["x"], "b": args["y"]})
        shout = await tools.call("py_upper", text=total.text)
        itself = await tools.call("solver", {"x": 1, "y": 1})
        verdict = await model_fn(f"check {shout.text}")
        return {"sum": total.text, "shout": shout.text, "self": itself.status, "model": verdict}

    def py_upper(text: str) -> str:
        """Upper-case."""
        return text.upper() + "!"

    async def broken(args, tools, model_fn):
        raise LookupError("workflow bug")

    params = {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
    }
    agent = AgentTool("solver", "Adds, shouts, checks.", solve, params, model=model)
    bad = AgentTool("bad", "Always fails.", broken)

    async def main():
        mcp = {"mcpServers": {"calc": server("calculator", include=["add"])}}
        async with ToolRunner([agent, bad, py_upper, model], ToolsConfig(max_concurrency=1), mcp=mcp) as r:
            # max_concurrency=1: the agent holds the only slot, its nested calls must not wait on it
            res = await asyncio.wait_for(r.call(ToolCall("solver", {"x": 2, "y": 3})), 30)
            out = json.loads(res.text)
            assert out == {"sum": "5.0", "shout": "5.0!", "self": UNKNOWN_TOOL, "model": "echo: check 5.0!"}
            failed = await r.call(ToolCall("bad", {"task": "t"}))
            assert failed.status == ERROR and "LookupError: workflow bug" in failed.text
        unbound = AgentTool("lonely", "not in a runner", solve)
        assert (await unbound.call({})).is_error

    asyncio.run(main())


def test_tool_result_of_a_model_tool_is_a_plain_result():
    assert isinstance(ToolResult(text="x"), ToolResult)
    with pytest.raises(ValueError, match="exactly one of"):
        ModelTool()
