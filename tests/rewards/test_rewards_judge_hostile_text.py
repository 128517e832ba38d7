"""Text that is not valid Unicode on its way to a judge (a row's question, the model's answer) or
back from one (a server's reply): each trajectory is still judged, and its chunk-mates too."""

import asyncio
import json
from http.server import BaseHTTPRequestHandler

import pytest
from judge_http import send_json, serving
from test_rewards_judge_local import make as make_local
from test_rewards_judge_local import tiny  # noqa: F401  (a pytest fixture)

from rlfactory.rewards import JudgeReward, LocalJudge, OpenAIJudge
from rlfactory.trajectory import Segment, Trajectory

HOSTILE_QUESTION = "What is the capital of France \ud83d? (NUL \x00)"


def test_a_local_judge_reads_lone_surrogates_and_nuls(tiny):  # noqa: F811
    model, tokenizer = tiny
    judge = LocalJudge(model, tokenizer, max_new_tokens=3, batch_size=8)
    trajs = [make_local("Paris"), make_local("Ly\udc80on"), make_local("Nice")]
    trajs[2].info["question"] = HOSTILE_QUESTION
    reward = JudgeReward(judge, batch_size=8)
    scores = asyncio.run(reward.score_many(trajs))
    assert len(scores) == 3 and judge.generate_calls == 1  # one chunk, judged whole
    assert all(set(s.terms) == {"score", "parsed"} for s in scores)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        self.server.prompts.append(prompt)
        if "Model answer: Paris" in prompt:  # the reply: a lone surrogate escape, then raw bytes that are not UTF-8
            data = b'{"choices":[{"message":{"role":"assistant","content":"\\ud83d Yes \xff\xfe, correct."}}]}'
        elif "DEEP" in prompt:
            data = b'{"choices":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
        else:
            data = json.dumps({"choices": [{"message": {"role": "assistant", "content": "No."}}]}).encode()
        send_json(self, data)


@pytest.fixture
def server():
    with serving(_Handler, prompts=[]) as srv:
        yield srv


def traj(answer: str, question: str = HOSTILE_QUESTION) -> Trajectory:
    segs = [Segment("prompt", [1], "p"), Segment("model", [2], f"<answer>{answer}</answer>", logprobs=[0.0])]
    return Trajectory(id=answer, group="g", segments=segs, info={"question": question, "answer": "Paris"})


def test_an_endpoint_judge_gets_valid_text_and_its_replies_are_read(server):
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    reward = JudgeReward(OpenAIJudge(url, "m", api_key_env=None, retries=0), on_error="fallback", fallback=-1.0)
    paris, lyon = asyncio.run(reward.score_many([traj("Paris"), traj("Lyon")]))
    assert paris.total == 1.0 and paris.terms["parsed"] == 1.0  # "\ufffd Yes \ufffd\ufffd, correct."
    assert lyon.total == 0.0
    # a body nested 50,000 deep is a judge error (the fallback), not a RecursionError out of score
    (deep,) = asyncio.run(reward.score_many([traj("DEEP")]))
    assert deep.total == -1.0 and deep.terms["parsed"] == 0.0
    assert len(server.prompts) == 3 and all("France \ufffd? (NUL \x00)" in p for p in server.prompts)
