"""JudgeReward with a local transformers judge: a tiny random Qwen3 model and a tokenizer trained
here offline. A random model's verdict is arbitrary, so this checks the plumbing: the prompt that
reaches the model, the reply that reaches the parser, batching and the cache."""

import asyncio

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from rlfactory.config import RewardConfig, validate
from rlfactory.rewards import JudgeReward, LocalJudge, build_reward
from rlfactory.rewards.judge import DEFAULT_TEMPLATE
from rlfactory.trajectory import Segment, Trajectory

SENTENCES = [
    "You are grading an answer to a question against a reference answer.",
    "Question: what is the capital of France? Reference answer: Paris. Model answer: Lyon.",
    "Is the model answer correct? Reply with just yes or no.",
]


@pytest.fixture(scope="module")
def tiny():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(SENTENCES, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval(), tokenizer


def make(answer, ref="Paris"):
    segs = [Segment("prompt", [1], "p"), Segment("model", [2], f"<answer>{answer}</answer>", logprobs=[0.0])]
    return Trajectory(id=answer, group="g", segments=segs, info={"question": "What is the capital of France?", "answer": ref})


def reference_replies(model, tokenizer, texts, max_new_tokens):
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def test_local_judge_prompt_reply_batching_and_cache(tiny):
    model, tokenizer = tiny
    judge = LocalJudge(model, tokenizer, system="Grade strictly.", max_new_tokens=4, batch_size=8)
    seen = []

    def parse(reply):
        seen.append(reply)
        return float(len(reply))

    reward = JudgeReward(judge, DEFAULT_TEMPLATE, parse)
    trajs = [make("Paris"), make("Lyon"), make("Paris"), make("Rome")]

    async def go():  # concurrent score() calls are coalesced into one generate batch
        return await asyncio.gather(*(reward.score(t) for t in trajs))

    scores = asyncio.run(go())
    assert judge.generate_calls == 1 and judge.requests == 3  # three distinct prompts, one batch

    prompts = list(dict.fromkeys(reward.build_prompt(t) for t in trajs))
    rendered = [judge.render(p) for p in prompts]
    assert rendered[0] == "Grade strictly.\n\n" + prompts[0]  # no chat template: plain text
    assert "Model answer: Lyon" in prompts[1] and "Reference answer: Paris" in prompts[1]
    expected = reference_replies(model, tokenizer, rendered, 4)
    assert [reward.cache[p].reply for p in prompts] == expected and sorted(seen) == sorted(expected)
    assert [s.total for s in scores] == [float(len(expected[i])) for i in (0, 1, 0, 2)]
    assert all(s.terms["parsed"] == 1.0 for s in scores)

    again = asyncio.run(reward.score_many(trajs))
    assert [s.total for s in again] == [s.total for s in scores]
    assert judge.generate_calls == 1 and reward.cache_hits == 3


def test_local_judge_uses_the_chat_template_and_small_batches(tiny):
    model, tokenizer = tiny
    tokenizer = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|endoftext|>")
    tokenizer.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
    judge = LocalJudge(model, tokenizer, max_new_tokens=3, batch_size=2)
    assert judge.render("hi") == "[user] hi\n[assistant] "
    replies = asyncio.run(judge.complete(["a", "b", "c"]))
    assert judge.generate_calls == 2 and len(replies) == 3
    assert replies == reference_replies(model, tokenizer, [judge.render(p) for p in "ab"], 3) + \
        reference_replies(model, tokenizer, [judge.render("c")], 3)


def test_build_reward_loads_a_local_judge_from_a_folder(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "judge")
    tokenizer.save_pretrained(tmp_path / "judge")
    (tmp_path / "judge.txt").write_text("Answer {answer} for {question}? Rate 0-10.", encoding="utf-8")
    cfg = validate(RewardConfig, {"judge": {"backend": "local", "model": str(tmp_path / "judge"),
                                            "template_file": "judge.txt", "score": "number", "max_tokens": 3}},
                   base_dir=str(tmp_path))
    reward = build_reward(cfg)
    assert isinstance(reward, JudgeReward) and isinstance(reward.judge, LocalJudge)
    s = asyncio.run(reward.score(make("Paris")))
    prompt = "Answer Paris for What is the capital of France?? Rate 0-10."
    assert list(reward.cache) == [prompt]
    reply = reward.cache[prompt].reply
    assert reply == reference_replies(model, tokenizer, [prompt], 3)[0]
    assert s.total == (reward.parse(reply) if reward.parse(reply) is not None else 0.0)
