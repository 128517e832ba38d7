"""The search env with real processes: the retriever server (Search-R1's HTTP API), the MCP
search server through ToolRunner, the solver's demonstrations and the reward."""

from __future__ import annotations

import asyncio
import os
import sys

import httpx
import pytest
from envs_helpers import demo_to_trajectory, score, with_final_answer

from rlfactory.envs import make_env
from rlfactory.envs.search.mcp_server import search_sync
from rlfactory.envs.search.prompts import format_results
from rlfactory.envs.search.service import RetrieverProcess
from rlfactory.tools import ToolCall, ToolRunner


@pytest.fixture(scope="module")
def env():
    e = make_env("search", seed=1, n_train_entities=30, n_test_entities=10)
    yield e
    e.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_http_api_matches_search_r1(env):
    url = env.url()
    r = httpx.post(url + "/retrieve", json={"queries": ["Where is X?", "who"], "topk": 3, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and all(len(hits) == 3 for hits in result)
    hit = result[0][0]
    assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
    assert isinstance(hit["score"], float)
    assert [h["score"] for h in result[0]] == sorted((h["score"] for h in result[0]), reverse=True)
    plain = httpx.post(url + "/retrieve", json={"queries": ["who"], "topk": 2}).json()["result"]
    assert set(plain[0][0]) == {"id", "contents"} and len(plain[0]) == 2
    assert httpx.post(url + "/retrieve", json={"queries": "not a list"}).status_code == 422


def test_retrieved_passage_for_a_generated_question(env):
    row = next(r for r in env.load_split("test") if r["extra_info"]["hops"] == 1)
    r = httpx.post(env.url() + "/retrieve", json={"queries": [row["question"]], "topk": 1, "return_scores": True})
    top = r.json()["result"][0][0]["document"]["contents"]
    assert top.split("\n")[0] == row["extra_info"]["subject"]
    assert row["golden_answers"][0] in top


def test_format_results_is_search_r1s():
    docs = [{"document": {"id": "0", "contents": "Kalo Mire\nKalo Mire was born in Dovan."}, "score": 1.0},
            {"id": "1", "contents": "Dovan\nDovan is a city in Pelor."}]
    assert format_results(docs) == (
        "Doc 1(Title: Kalo Mire) Kalo Mire was born in Dovan.\nDoc 2(Title: Dovan) Dovan is a city in Pelor.\n")


def test_retriever_process_is_stopped_and_reports_a_bad_corpus(tmp_path, env):
    proc = RetrieverProcess(env.corpus).start()
    pid = proc.proc.pid
    assert httpx.get(proc.url + "/health").json() == {"status": "ok", "docs": len(open(env.corpus).readlines())}
    proc.stop()
    assert not _alive(pid)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0"}\n')
    with pytest.raises(RuntimeError, match="contents"):
        RetrieverProcess(bad, startup_timeout_s=20).start()


def test_mcp_search_tool_through_tool_runner(env):
    row = next(r for r in env.load_split("test") if r["extra_info"]["hops"] == 2)
    subject = row["extra_info"]["subject"]

    async def go():
        async with ToolRunner(mcp=env.tools().mcp) as runner:
            specs = {s.name: s for s in runner.specs()}
            results = await env.step([ToolCall("search", {"query": subject}), ToolCall("search", {})], runner)
            return specs, results

    specs, (good, bad) = asyncio.run(go())
    assert list(specs) == ["search"] and specs["search"].parameters["required"] == ["query"]
    assert not good.is_error and good.text.startswith(f"Doc 1(Title: {subject}) {subject} was born in ")
    assert good.text == search_sync(env.url(), subject, env.topk)  # what the solver's demonstrations show
    assert bad.is_error  # missing argument: an observation, not an exception


@pytest.mark.parametrize("family", ["qwen3", "searchr1"])
def test_solver_demonstrations_search_each_hop_and_score_one(env, family):
    env.family = family
    try:
        rows = env.load_split("test")
        for hops in (1, 2):
            row = next(r for r in rows if r["extra_info"]["hops"] == hops)
            demo = env.solve(row)
            calls = [m for m in demo if m.get("tool_calls")]
            assert len(calls) == hops  # a multi-hop question needs a search per hop
            # each later query is a name read off the previous real tool result
            for call, result in zip(calls[1:], [m for m in demo if m["role"] == "tool"]):
                assert call["tool_calls"][0]["function"]["arguments"]["query"] in result["content"]
            traj = demo_to_trajectory(env, row, demo)
            s = score(env, traj)
            assert s.total == pytest.approx(1.0) and s.terms["exact_match"] == 1.0
            wrong = score(env, demo_to_trajectory(env, row, with_final_answer(demo, "Nowhere", env)))
            assert wrong.total == pytest.approx(0.1)  # format only
    finally:
        env.family = "qwen3"


def test_prompt_adapts_to_the_family(env):
    row = env.load_split("train")[0]
    env.family = "searchr1"
    try:
        system, user = env.reset(row)
        assert system["role"] == "system" and "<search> query </search>" in system["content"]
        assert user == {"role": "user", "content": f"Question: {row['question']}"}
        env.searchr1_single_turn = True
        (user,) = env.reset(row)  # Search-R1's exact prompt, as in the parquet file
        assert user == row["prompt"][0] and user["content"].endswith(f"Question: {row['question']}\n")
    finally:
        env.family, env.searchr1_single_turn = "qwen3", False
    system, user = env.reset(row)
    assert system["role"] == "system" and "search tool" in system["content"] and user["content"] == row["question"]


def test_env_stops_its_retriever_on_close():
    e = make_env("search", seed=2, n_train_entities=5, n_test_entities=2)
    e.url()
    pid, tmp = e._retriever.proc.pid, e._tmp
    e.close()
    assert not _alive(pid) and not os.path.exists(tmp)


def test_user_data_without_corpus_is_a_clear_error(env, tmp_path):
    e = make_env("search", train_data=env.data["train"])
    assert len(e.load_split("train")) == len(env.load_split("train"))
    with pytest.raises(ValueError, match="corpus"):
        e.tools()
    with pytest.raises(ValueError, match="test"):
        e.load_split("test")


def test_retriever_exits_when_its_parent_dies(env, tmp_path):
    # A parent that starts a retriever and is then SIGKILLed: the server must not outlive it.
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys\nfrom rlfactory.envs.search.service import RetrieverProcess\n"
        f"p = RetrieverProcess({env.corpus!r}).start()\nprint(p.proc.pid, flush=True)\nos.kill(os.getpid(), 9)\n"
    )
    import subprocess
    import time

    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_solver_on_user_rows_answers_only_what_it_finds(env, tmp_path):
    from rlfactory.envs.data import write_parquet

    def user_row(question, answers):  # an NQ-style row: no subject/relations to follow
        return {"question": question, "golden_answers": answers, "data_source": "nq",
                "prompt": [{"role": "user", "content": f"Question: {question}"}], "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
                "extra_info": {"split": "test", "index": 0}}

    q = next(r for r in env.load_split("test") if r["extra_info"]["hops"] == 1)
    path = write_parquet([user_row(q["question"], q["golden_answers"]), user_row("Who is Zzz?", ["Qqq"])],
                         tmp_path / "nq.parquet")
    with make_env("search", test_data=str(path), retriever_url=env.url()) as user_env:
        found, missing = user_env.load_split("test")
        demo = user_env.solve(found)
        assert [m["tool_calls"][0]["function"]["arguments"] for m in demo if m.get("tool_calls")] == [
            {"query": q["question"]}]
        assert score(user_env, demo_to_trajectory(user_env, found, demo)).total == pytest.approx(1.0)
        with pytest.raises(ValueError, match="no ground-truth answer"):
            user_env.solve(missing)


def test_world_writer_command(tmp_path):
    from rlfactory.envs.data import read_parquet
    from rlfactory.envs.search.world import main

    assert main(["--out", str(tmp_path), "--seed", "4", "--train-entities", "8", "--test-entities", "3"]) == 0
    rows = read_parquet(tmp_path / "train.parquet")
    assert rows and set(rows[0]) >= {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert rows[0]["reward_model"]["style"] == "rule" and rows[0]["reward_model"]["ground_truth"]["target"]
    assert rows[0]["extra_info"]["split"] == "train" and rows[0]["extra_info"]["index"] == 0


@pytest.mark.parametrize("family", ["qwen3", "searchr1"])
def test_demonstrations_rendered_by_the_real_tool_manager_score_one(env, family):
    """Render the solver's demonstrations with the family's ToolManager and rlfactory's tiny
    tokenizer (as warm-start SFT does), decode the model tokens and score them."""
    from transformers import AutoTokenizer

    from rlfactory.chat import make_tool_manager
    from rlfactory.tiny import ensure_tiny
    from rlfactory.tools import ToolSpec
    from rlfactory.train.sft import demo_to_trajectory as render

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_tiny("1m")))
    manager = make_tool_manager(tokenizer, family)
    spec = ToolSpec("search", "Search the corpus.", {"type": "object", "properties": {"query": {"type": "string"}}})
    env.family = family
    try:
        for row in [r for r in env.load_split("test") if r["extra_info"]["hops"] == 2][:2]:
            traj = render(env.solve(row), manager, [spec])
            for seg in traj.segments:
                seg.text = tokenizer.decode(seg.token_ids)
            traj.info = env.info(row)
            assert score(env, traj).total == pytest.approx(1.0), traj.model_text()
    finally:
        env.family = "qwen3"


def test_guess_rate_makes_the_solver_answer_some_train_rows_without_searching(env):
    rows = env.load_split("train")
    assert all(any(m.get("tool_calls") for m in env.solve(r)) for r in rows[:20])  # default: always searches
    env.guess_rate = 0.5
    try:
        demos = [env.solve(r) for r in rows]
        guessed = [(r, d) for r, d in zip(rows, demos) if not any(m.get("tool_calls") for m in d)]
        assert 0.3 * len(rows) < len(guessed) < 0.7 * len(rows)
        assert demos == [env.solve(r) for r in rows]  # the same rows guess every time
        kinds = {}
        for r in rows:
            kinds.setdefault(tuple(r["extra_info"]["relations"]), set()).add(r["golden_answers"][0])
        for r, d in guessed:
            assert d[-1]["role"] == "assistant" and d[-1]["content"]  # an answer, straight away
            answer = d[-1]["content"].removeprefix("<answer>").removesuffix("</answer>")
            assert answer in kinds[tuple(r["extra_info"]["relations"])]  # a value of the right kind
        wrong = sum(d[-1]["content"] != f"<answer>{r['golden_answers'][0]}</answer>" for r, d in guessed)
        assert wrong > 0.5 * len(guessed)  # guesses are mostly wrong: searching pays
        # test rows are never guessed: they are what the solver's reference searches come from
        assert all(any(m.get("tool_calls") for m in env.solve(r)) for r in env.load_split("test"))
    finally:
        env.guess_rate = 0.0
        env._guesses = None


def test_guess_rate_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match="guess_rate"):
        make_env("search", seed=1, n_train_entities=5, n_test_entities=2, guess_rate=1.5)
