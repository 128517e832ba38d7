"""Images over the server backend (issue 31). The client sends a turn's images the way SGLang's
`/generate` takes them with token ids (`image_data`, data URLs in pad order: the exact body is
checked against a recording HTTP server); vLLM's API cannot carry them, so `api: vllm` refuses in
one line. `rlfactory serve` of tiny-vl reads `image_data` into the local generator's vision
prefill: a real `rlfactory serve` process gives the same tokens and logprobs as the local
generator, turn by turn and for a whole rollout of the visual env (zoomed pictures included), and
a GRPO step on it samples with the trainer's pixels and pushes the vision weights back.
Bad image requests get a 400 naming the cause, and never fail the other requests of their batch."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from transformers import AutoTokenizer

from rlfactory.chat.contract import SAMPLE_TOOLS
from rlfactory.config import ModelConfig, RunConfig, SamplingConfig
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.model_source import load_model
from rlfactory.generation.server_api import ImagesNotCarried
from rlfactory.generation.server_generator import ServerGenerator
from rlfactory.images import image_from_value
from rlfactory.protocols import GenRequest
from rlfactory.serve.app import build_app
from rlfactory.serve.process import ServeProcess
from rlfactory.serve.served import ServedModel, pixel_source
from rlfactory.serve.thread import AppThread
from rlfactory.tiny import resolve_model
from rlfactory.tools.base import ToolResult
from rlfactory.train.run import load_env_data
from rlfactory.train.session import open_rollout
from scripted_visual import policy
from vl_parts import picture

HERE = Path(__file__).parent
SGLANG_ANSWER = json.loads((HERE.parent / "generation" / "fixtures" / "sglang_generate_length.json").read_text())["response"]
GREEDY = SamplingConfig(greedy=True)

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder:
    """A real HTTP server answering SGLang's `/generate` with the documented body; keeps what it got."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

        async def generate(request: Request) -> Response:
            self.bodies.append(await request.json())
            return JSONResponse(SGLANG_ANSWER)

        async def health(request: Request) -> Response:
            return Response(status_code=200)

        self.thread = AppThread(Starlette(routes=[Route("/generate", generate, methods=["POST"]),
                                                  Route("/health", health, methods=["GET"])]))


class Ids:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def test_sglang_body_carries_the_images_as_data_urls_in_pad_order():
    first, second = picture(24, 40, (200, 0, 0)), picture(16, 16, (0, 0, 200))
    rec = Recorder()

    async def main():
        g = ServerGenerator([rec.thread.url], "sglang", Ids(), [7], timeout_s=10.0)
        try:
            return await g.submit(GenRequest([1, 2, 3, 4], 5, GREEDY, session="t0", images=[first, second]))
        finally:
            await g.aclose()

    with rec.thread:
        out = asyncio.run(main())
    body = rec.bodies[0]
    assert set(body) == {"input_ids", "image_data", "sampling_params", "return_logprob", "logprob_start_len",
                         "top_logprobs_num", "stream"}  # not rlfactory serve: no session_id
    assert body["input_ids"] == [1, 2, 3, 4]
    assert body["image_data"] == ["data:image/png;base64," + base64.b64encode(im.data).decode() for im in (first, second)]
    assert [image_from_value(u).sha256 for u in body["image_data"]] == [first.sha256, second.sha256]
    assert body["sampling_params"]["temperature"] == 0.0 and body["return_logprob"] is True
    assert out.token_ids == SGLANG_ANSWER["output_ids"]


def test_vllm_api_refuses_images_in_one_line_before_sending_anything():
    rec = Recorder()

    async def main():
        g = ServerGenerator([rec.thread.url], "vllm", Ids(), [7], timeout_s=10.0)
        try:
            await g.submit(GenRequest([1, 2, 3], 2, images=[picture(16, 16, (0, 0, 0))]))
        finally:
            await g.aclose()

    with rec.thread, pytest.raises(ImagesNotCarried) as e:
        asyncio.run(main())
    assert "\n" not in str(e.value) and "generator.api: sglang" in str(e.value) and "/v1/completions" in str(e.value)
    assert rec.bodies == []


def test_rollout_command_with_api_vllm_on_image_prompts_is_a_one_line_config_error(tmp_path, capsys):
    import yaml

    from rlfactory.cli.main import main

    rec = Recorder()
    with rec.thread:
        cfg = tmp_path / "run.yaml"
        cfg.write_text(yaml.safe_dump({
            "model": {"path": "tiny-vl:1m"}, "env": {"name": "visual", "options": {"n_train": 2, "n_test": 2}},
            "rollout": {"max_turns": 2, "max_new_tokens": 8, "max_total_tokens": 1024},
            "generator": {"backend": "server", "api": "vllm", "urls": [rec.thread.url]},
            "trainer": {"run_dir": str(tmp_path / "run"), "progress": False}}))
        code = main(["rollout", str(cfg), "--out", str(tmp_path / "out.jsonl"), "--limit", "1", "--no-reward"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and rec.bodies == []
    assert err[-1].startswith("rlfactory: config error: generator.api: vllm cannot send images"), err[-3:]


# ---- rlfactory serve of tiny-vl ------------------------------------------------------------------

@pytest.fixture(scope="module")
def vl():
    """tiny-vl:1m as `rlfactory serve` loads it, with its VL ToolManager (the pixel source)."""
    model, tok = load_model(ModelConfig(path="tiny-vl:1m"), "cpu")
    return model.eval(), tok, pixel_source(model, tok)


@pytest.fixture(scope="module")
def serve():
    """A real `rlfactory serve tiny-vl:1m` process."""
    with ServeProcess("tiny-vl:1m", ["--threads", "1", "--seed", "0"]) as proc:
        yield proc.url


async def three_turns(gen, tm, name: str, first, tool_pictures) -> list[tuple[list[int], list[float]]]:
    """Three greedy turns of 6 tokens; tool results with `tool_pictures[k]` between them."""
    content = [{"type": "text", "text": f"Look ({name})."}] + ([{"type": "image", "image": first}] if first else [])
    prompt = tm.render_prompt_images([{"role": "user", "content": content}], SAMPLE_TOOLS)
    ids, images, out = list(prompt.ids), list(prompt.images), []
    for turn in range(3):
        res = await gen.submit(GenRequest(list(ids), 6, GREEDY, stop_token_ids=[], session=name,
                                          images=list(images) or None))
        out.append((res.token_ids, res.logprobs))
        ids += res.token_ids
        if turn < 2:
            obs = tm.render_observation_images([ToolResult(f"result {turn}", images=tool_pictures[turn])])
            ids += obs.ids
            images += obs.images
    gen.forget(name)
    return out


SCRIPTS = {"a": (picture(48, 32, (9, 99, 9)), [[picture(24, 40, (200, 0, 0)), picture(16, 16, (0, 0, 200))], []]),
           "b": (picture(20, 60, (30, 60, 90)), [[], [picture(64, 16, (1, 2, 3))]]),
           "c": (None, [[], []])}


def test_turns_over_rlfactory_serve_equal_the_local_generator(vl, serve):
    model, tok, tm = vl

    async def rollouts(gen):
        try:
            return await asyncio.gather(*(three_turns(gen, tm, n, *SCRIPTS[n]) for n in SCRIPTS))
        finally:
            if isinstance(gen, ServerGenerator):
                await gen.aclose()

    local = LocalGenerator(model, tok.pad_token_id or 0, tokenizer=tok, pixels=tm)
    try:
        want = asyncio.run(rollouts(local))
    finally:
        local.close()
    got = asyncio.run(rollouts(ServerGenerator([serve], "sglang", tok, timeout_s=60.0)))
    for w, g in zip(want, got):
        for (w_ids, w_lp), (g_ids, g_lp) in zip(w, g):
            assert g_ids == w_ids
            assert g_lp == pytest.approx(w_lp, abs=1e-4)
    health = httpx.get(serve + "/health").json()
    assert health["images"] is True


def test_a_visual_env_rollout_on_the_server_backend_equals_the_local_backend(tmp_path):
    """`generator.backend: server` (api sglang) against `rlfactory serve` of tiny-vl with the
    scripted zoom policy gives the local backend's trajectories: prompt and zoomed pictures, tokens, logprobs."""

    def config(**generator) -> RunConfig:
        return RunConfig.model_validate({
            "model": {"path": "tiny-vl:1m"}, "env": {"name": "visual", "options": {"n_train": 4, "n_test": 1}},
            "rollout": {"max_turns": 3, "max_new_tokens": 96, "max_total_tokens": 1024, "mode": "async"},
            "sampling": {"greedy": True}, "generator": generator,
            "trainer": {"run_dir": str(tmp_path / "run"), "progress": False}})

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-vl:1m"))

    async def roll(cfg: RunConfig, processor=None):
        async with open_rollout(cfg, reward_mode="off", logits_processor=processor) as session:
            rows = load_env_data(session.env, "train")[:3]
            return await session.engine.run(rows, 1)

    want = asyncio.run(roll(config(), policy(tok)))
    with ServeProcess("tiny-vl:1m", ["--threads", "1", "--logits-processor", "scripted_visual:policy"],
                      cwd=str(HERE)) as proc:
        got = asyncio.run(roll(config(backend="server", urls=[proc.url], api="sglang")))
    assert all(len(t.images()) == 2 for t in want), [t.status for t in want]  # the prompt's picture and the zoomed one
    for w, g in zip(want, got):
        assert [s.role for s in g.segments] == [s.role for s in w.segments]
        for ws, gs in zip(w.segments, g.segments):
            assert gs.token_ids == ws.token_ids
            assert [im.sha256 for im in gs.images or ()] == [im.sha256 for im in ws.images or ()]
            if ws.role == "model":
                assert gs.logprobs == pytest.approx(ws.logprobs, abs=1e-4)


# ---- what rlfactory serve refuses ------------------------------------------------------------

@pytest.fixture(scope="module")
def app_url(vl):
    model, tok, tm = vl
    served = ServedModel(model, tok, name="tiny-vl:1m", pad_id=tok.pad_token_id or 0, pixels=tm)
    with AppThread(build_app(served)) as srv:
        yield srv.url
    served.close()


def _body(ids, images, n=4):
    return {"input_ids": ids, "image_data": images, "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0}}


def _prompt(tm, image):
    rendered = tm.render_prompt_images([{"role": "user", "content": [{"type": "text", "text": "Look."},
                                                                        {"type": "image", "image": image}]}], [])
    url = "data:image/png;base64," + base64.b64encode(image.data).decode()
    return rendered.ids, url


def test_a_bad_image_request_is_refused_alone_while_its_batch_goes_on(vl, app_url):
    _, _, tm = vl
    ids, url = _prompt(tm, picture(32, 32, (5, 200, 5)))
    other = picture(64, 64, (200, 5, 5))  # more pads than `ids` holds for one 32x32 picture

    async def main():
        async with httpx.AsyncClient(base_url=app_url, timeout=60.0) as c:
            good = [c.post("/generate", json=_body(ids, [url], n=8)) for _ in range(3)]
            bad = c.post("/generate", json=_body(ids, ["data:image/png;base64," + base64.b64encode(other.data).decode()]))
            return await asyncio.gather(bad, *good)

    bad, *good = asyncio.run(main())
    assert bad.status_code == 400 and "stand for" in bad.json()["error"]["message"], bad.text
    assert [r.status_code for r in good] == [200, 200, 200], [r.text for r in good]
    assert len({tuple(r.json()["output_ids"]) for r in good}) == 1


@pytest.mark.parametrize("images, words", [
    (["https://example.com/a.png"], "not URLs or file names"),
    (["/etc/passwd.png"], "not URLs or file names"),
    (["not base64 at all!"], "not valid base64"),
    ([["data:image/png;base64,AAAA"]], "not a batch"),
    ([12], "must be a data: URL or base64"),
])
def test_image_data_that_is_not_an_inline_image_is_a_400_naming_it(vl, app_url, images, words):
    _, _, tm = vl
    ids, _ = _prompt(tm, picture(32, 32, (5, 200, 5)))
    r = httpx.post(app_url + "/generate", json=_body(ids, images), timeout=60.0)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_completions_and_text_models_take_no_images(vl, app_url, tiny):
    _, _, tm = vl
    ids, url = _prompt(tm, picture(32, 32, (5, 200, 5)))
    r = httpx.post(app_url + "/v1/completions", json={"prompt": ids, "image_data": [url], "max_tokens": 2}, timeout=60.0)
    assert r.status_code == 400 and "/v1/completions takes no images" in r.json()["error"]["message"]
    model, tok = tiny
    assert pixel_source(model, tok) is None
    served = ServedModel(model, tok, name="tiny:1m", pad_id=tok.pad_token_id or 0)
    try:
        with AppThread(build_app(served)) as srv:
            r = httpx.post(srv.url + "/generate", json=_body([1, 2, 3], [url]), timeout=60.0)
    finally:
        served.close()
    assert r.status_code == 400 and "not a vision-language model" in r.json()["error"]["message"]


def test_a_grpo_step_on_rlfactory_serve_samples_with_the_trainers_pixels_and_pushes_the_vision_weights(tmp_path):
    """One GRPO step on the visual env with `generator.backend: server` (api sglang) against
    `rlfactory serve tiny-vl:1m`: the server's logprobs of its sampled tokens are the trainer's
    (same pixels, same M-RoPE positions), and the weight sync leaves the server with exactly the
    learner's weights, vision tower included."""
    from rlfactory.serve.weights import weights_digest
    from rlfactory.train.loop import Trainer

    with ServeProcess("tiny-vl:1m", ["--threads", "1", "--seed", "0"]) as proc:
        cfg = RunConfig.model_validate({
            "model": {"path": "tiny-vl:1m"}, "env": {"name": "visual", "options": {"n_train": 4, "n_test": 1}},
            "rollout": {"max_turns": 2, "max_new_tokens": 16, "max_total_tokens": 1024, "mode": "async"},
            "generator": {"backend": "server", "api": "sglang", "urls": [proc.url]},
            "reward": {"terms": {"exact_match": 1.0, "scripted_visual:low_ids": 1.0}},  # varies: the update moves
            "algo": {"group_size": 2}, "trainer": {"steps": 1, "prompts_per_step": 2, "lr": 1e-2,
                                                   "run_dir": str(tmp_path / "run"), "progress": False}})

        async def main():
            async with open_rollout(cfg, reward_mode="required") as session:
                trainer = Trainer(cfg, session, session.reward, load_env_data(session.env, "train"))
                start = weights_digest(session.model)
                metrics, trajs = await trainer.step(1)
                return metrics, trajs, start, weights_digest(session.model)

        metrics, trajs, start, learner = asyncio.run(main())
        served = httpx.get(proc.url + "/weights_digest", timeout=60).json()
    assert len(trajs) == 4 and all(t.status != "infra_error" and t.segments[0].images for t in trajs), \
        [(t.status, t.error) for t in trajs]
    assert metrics["mismatch/max_abs_diff"] < 1e-3, metrics
    assert learner != start  # the update moved the weights
    assert metrics["weight_sync/ok"] == 1 and served == {"sha256": learner, "policy_version": 1}
