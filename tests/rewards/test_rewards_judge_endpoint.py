"""JudgeReward against a real local HTTP server speaking the OpenAI chat-completions shape."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlfactory.config import RewardConfig, validate
from rlfactory.rewards import JudgeError, JudgeReward, OpenAIJudge, build_reward, number_score
from rlfactory.trajectory import Segment, Trajectory
from judge_http import send_json, serving


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        prompt = body["messages"][-1]["content"]
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": "not found"})
        if "BAD REQUEST" in prompt:
            return self._send(400, {"error": {"message": "bad"}})
        if "FLAKY" in prompt:
            with srv.lock:
                srv.flaky += 1
                first = srv.flaky == 1
            if first:
                return self._send(503, {"error": "busy"})
        if "score out of 10" in prompt:
            reply = "Score: 7/10"
        elif "Model answer: Paris" in prompt:
            reply = "<think>the reference says Paris</think>Yes, it is correct."
        elif "(no answer)" in prompt:
            reply = "I cannot tell."
        else:
            reply = "No."
        self._send(200, {"id": "x", "object": "chat.completion", "model": body["model"],
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]})

    def _send(self, code, payload):
        send_json(self, payload, code)


@pytest.fixture
def server():
    with serving(_Handler, seen=[], flaky=0, lock=threading.Lock()) as srv:
        srv.base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
        yield srv


def make(answer, question="What is the capital of France?", ref="Paris", status="ok"):
    text = f"<answer>{answer}</answer>" if answer is not None else "I give up"
    segs = [Segment("prompt", [1], "p"), Segment("model", [2], text, logprobs=[0.0])]
    return Trajectory(id=str(answer), group="g", segments=segs, status=status, info={"question": question, "answer": ref})


def test_score_many_batches_parses_and_caches(server, monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test")
    judge = OpenAIJudge(server.base_url, "judge-model", api_key_env="TEST_JUDGE_KEY", system="Be strict.", max_tokens=16)
    reward = JudgeReward(judge, batch_size=2)
    trajs = [make("Paris"), make("Lyon"), make("Paris"), make(None), make("Rome")]
    scores = asyncio.run(reward.score_many(trajs))
    assert [s.total for s in scores] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert [s.terms["parsed"] for s in scores] == [1.0, 1.0, 1.0, 0.0, 1.0]  # "I cannot tell." is unparsed
    assert len(server.seen) == 4 and judge.requests == 4  # the two identical prompts went once
    req = server.seen[0]
    assert req["auth"] == "Bearer sk-test" and req["path"] == "/v1/chat/completions"
    body = req["body"]
    assert body["model"] == "judge-model" and body["max_tokens"] == 16 and body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": "Be strict."}
    prompts = {s["body"]["messages"][1]["content"] for s in server.seen}
    assert reward.build_prompt(trajs[0]) in prompts
    assert "Question: What is the capital of France?" in reward.build_prompt(trajs[0])
    assert "Reference answer: Paris" in reward.build_prompt(trajs[0])
    # everything is cached now: no new request
    again = asyncio.run(reward.score_many(trajs[:3]))
    assert [s.total for s in again] == [1.0, 0.0, 1.0] and len(server.seen) == 4
    assert reward.cache_hits == 2 and len(reward.cache) == 4


def test_concurrent_score_calls_and_number_template(server):
    template = "Q: {question}\nA: {answer}\nRef: {reference}\nGive a score out of 10."
    reward = JudgeReward(OpenAIJudge(server.base_url, "m", api_key_env=None), template, number_score(10.0))

    async def go():
        return await asyncio.gather(*(reward.score(make(a)) for a in ("x", "y", "x")))

    scores = asyncio.run(go())
    assert [s.total for s in scores] == [pytest.approx(0.7)] * 3
    assert len(server.seen) == 2 and server.seen[0]["auth"] is None


def test_retry_on_503_then_errors(server):
    judge = OpenAIJudge(server.base_url, "m", api_key_env=None, retries=1)
    reward = JudgeReward(judge)
    assert asyncio.run(reward.score(make("FLAKY"))).terms == {"score": 0.0, "parsed": 1.0}
    assert server.flaky == 2

    with pytest.raises(JudgeError, match="400"):
        asyncio.run(reward.score(make("BAD REQUEST")))
    lenient = JudgeReward(judge, on_error="fallback", fallback=0.25)
    s = asyncio.run(lenient.score(make("BAD REQUEST")))
    assert s.total == 0.25 and s.terms["parsed"] == 0.0 and not lenient.cache


def test_unreachable_judge_raises():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = srv.server_address[1]
    srv.server_close()  # nothing listens there any more
    reward = JudgeReward(OpenAIJudge(f"http://127.0.0.1:{port}/v1", "m", api_key_env=None, retries=0, timeout_s=5))
    with pytest.raises(JudgeError, match="unreachable"):
        asyncio.run(reward.score_many([make("Paris")]))


def test_build_reward_with_a_judge_part(server):
    cfg = validate(RewardConfig, {
        "terms": {"exact_match": 1.0},
        "judge": {"base_url": server.base_url, "model": "m", "api_key_env": None, "weight": 0.5},
    })
    reward = build_reward(cfg)
    s = asyncio.run(reward.score(make("Paris")))
    assert s.terms == {"rule": 1.0, "rule/exact_match": 1.0, "judge": 1.0, "judge/score": 1.0, "judge/parsed": 1.0}
    assert s.total == pytest.approx(1.5)
    s = asyncio.run(reward.score(make("Lyon")))
    assert s.total == 0.0
