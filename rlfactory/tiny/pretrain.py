"""`tiny:<size>-copy`: rlfactory's tiny model after a short pretraining on generic copy text.

A model trained from scratch on one task's few hundred demonstrations learns the format and the
tool name quickly but not to copy an unseen value from the question into the call (README "Your own
task"). Copying is generic, so its groundwork is laid once, on first use, from
rlfactory/tiny/copy_corpus.py (random tools, names and numbers; nothing of any one task), and
cached beside `tiny:<size>` (rlfactory/tiny/cache.py). The result is no copier by itself (teacher-
forced, copy recipe 1 got 14% of generic call values right, 1.5% before), but from it a few hundred
demonstrations of a task teach copying, which they do not from `tiny:<size>`. Same tokenizer as
`tiny:<size>` (numbers are one token a digit), same architecture; only the weights differ.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from rlfactory.tiny import copy_corpus
from rlfactory.tiny.model import MARKER, RECIPE_VERSION, save_quietly

# Bump when the copy corpus or the recipe below changes: cached copy models are rebuilt.
COPY_RECIPE_VERSION = 2  # 2: numbers of 1-8 digits, answer_doc, the final answer as rlfactory writes it
COPY_SUFFIX = "-copy"


@dataclass(frozen=True)
class CopyRecipe:
    """How the copy pretraining runs. `steps * batch_size * seq_len` tokens in all."""

    steps: int = 1200
    """1200, not recipe 1's 900: a fourth kind of document takes a seventh of the text, and in the
    units trials (benchmarks/units_copy_trials.py, seed-1 rows) 1200 steps varied less by seed."""
    batch_size: int = 4
    seq_len: int = 512
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.01
    mix: tuple[float, float, float, float] = (3.0, 4.0, 2.0, 1.5)
    """Weights of chat documents (full chat template with a tools block), compact_doc, answer_doc
    and recall_doc."""


def _doc_ids(tok: Any, rng: random.Random, mix: tuple[float, ...]) -> list[int]:
    kind = rng.choices(["chat", "compact", "answer", "recall"], mix)[0]
    if kind == "chat":
        msgs, tools = copy_corpus.chat_messages(rng)
        text = copy_corpus.chat_text(tok, msgs, tools)
    elif kind == "compact":
        text = copy_corpus.compact_doc(rng)
    elif kind == "answer":
        text = copy_corpus.answer_doc(rng)
    else:
        text = copy_corpus.recall_doc(rng)
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.pad_token_id]


def batches(tok: Any, seed: int, recipe: CopyRecipe):
    """Rows of `recipe.seq_len` tokens cut from a stream of documents (each ended by
    `<|endoftext|>`), `recipe.batch_size` at a time, forever; the same for the same seed."""
    import torch

    rng = random.Random(seed)
    buf: list[int] = []
    need = recipe.batch_size * recipe.seq_len
    while True:
        while len(buf) < need:
            buf += _doc_ids(tok, rng, recipe.mix)
        rows, buf = buf[:need], buf[need:]
        yield torch.tensor(rows).view(recipe.batch_size, recipe.seq_len)


def _lr_at(step: int, recipe: CopyRecipe) -> float:
    """Linear warm-up, then cosine down to a tenth."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    t = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pretrain_copy(model: Any, tok: Any, seed: int, recipe: CopyRecipe,
                  log: Callable[[str], None] = _say, name: str = "tiny-copy") -> list[float]:
    """Train `model` in place on the generic copy corpus; returns the loss of every step."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay)
    model.train()
    losses: list[float] = []
    start = time.monotonic()
    every = max(1, recipe.steps // 10)
    device = next(model.parameters()).device
    for step, ids in zip(range(recipe.steps), batches(tok, seed, recipe)):
        ids = ids.to(device)
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, recipe)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == recipe.steps:
            spent = time.monotonic() - start
            left = spent / (step + 1) * (recipe.steps - step - 1)
            log(f"{name}: pretraining step {step + 1}/{recipe.steps}: loss {sum(losses[-every:]) / len(losses[-every:]):.3f}, "
                f"{spent:.0f} s so far, about {left:.0f} s left")
    model.eval()
    return losses


def make_copy_model(out: str | Path, base: str | Path, size: str, seed: int = 0,
                    recipe: CopyRecipe = CopyRecipe(), log: Callable[[str], None] = _say) -> Path:
    """Write `tiny:<size>-copy` to `out`: the tokenizer and initial weights of `base` (the
    `tiny:<size>` folder of the same seed), pretrained on generic copy text. Deterministic by
    `seed` for a given torch thread count."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, base = Path(out), Path(base)
    out.mkdir(parents=True, exist_ok=True)
    name = f"tiny:{size}{COPY_SUFFIX}"
    tokens = recipe.steps * recipe.batch_size * recipe.seq_len
    log(f"{name}: first use: pretraining tiny:{size} on {tokens:,} tokens of generic copy text "
        f"({recipe.steps} steps; a few minutes on a CPU core; cached in {out.parent})")
    tok = AutoTokenizer.from_pretrained(base)
    with torch.random.fork_rng(devices=[]), _quiet_loading():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        start = time.monotonic()
        losses = pretrain_copy(model, tok, seed, recipe, log, name)
        seconds = time.monotonic() - start
    for f in base.iterdir():
        if f.is_file() and f.name not in (MARKER, "model.safetensors"):
            shutil.copy2(f, out / f.name)
    save_quietly(model, out)
    marker = {"copy_recipe_version": COPY_RECIPE_VERSION, "recipe_version": RECIPE_VERSION, "size": size, "seed": seed, "recipe": asdict(recipe),
              "tokens": tokens, "final_loss": sum(losses[-20:]) / len(losses[-20:]), "seconds": round(seconds, 1),
              "num_parameters": sum(p.numel() for p in model.parameters())}
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    log(f"{name}: built in {seconds:.0f} s (final loss {marker['final_loss']:.3f})")
    return out


@contextlib.contextmanager
def _quiet_loading():
    """No "Loading weights" progress bar in the middle of another command's output."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def is_current_copy(path: Path) -> bool:
    """Whether `path` holds a copy model of this copy recipe, made from a base of the current recipe."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("copy_recipe_version") == COPY_RECIPE_VERSION and marker.get("recipe_version") == RECIPE_VERSION


@dataclass
class CopyCheck:
    """Greedy tool calls on held-out generic questions that name their parameters."""

    prompts: int
    calls: int
    """Outputs that parse as a `<tool_call>` naming the right tool."""
    exact: int
    """Calls whose arguments equal the question's values exactly."""
    examples: list[str]


def copy_check(model: Any, tok: Any, seed: int, n: int = 20, max_new_tokens: int = 80) -> CopyCheck:
    """Ask `n` generic questions the pretraining never saw (drawn from another seed) and count
    the calls that copy every value exactly."""
    import torch

    rng = random.Random(10_000 + seed)
    calls = exact = 0
    examples: list[str] = []
    for _ in range(n):
        msgs, tools = copy_corpus.chat_messages(rng, copy_corpus.NAMED_STYLES)
        call = msgs[-3]["tool_calls"][0]["function"]
        ids = tok.apply_chat_template(msgs[:-3], tools=tools, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"].to(model.device)
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        text = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
        got = _parse_call(text)
        if got is not None and got.get("name") == call["name"]:
            calls += 1
            exact += got.get("arguments") == call["arguments"]
        if len(examples) < 3:
            examples.append(f"{msgs[-4]['content']} -> {text.strip()}")
    return CopyCheck(prompts=n, calls=calls, exact=exact, examples=examples)


def copied_token_accuracy(model: Any, tok: Any, seed: int, n: int = 16, part: str = "call") -> float:
    """Teacher-forced: of the tokens that `n` held-out generic conversations (drawn from another
    seed) copy, the share that the model predicts exactly (argmax). `part`: "call", the argument
    values in the tool call (each also in the question), or "answer", the value in the final
    `<answer>` (also in the tool's response). A model that knows the format but cannot copy
    guesses digits and words (about one in ten at best); one that copies gets most."""
    import torch

    if part not in ("call", "answer"):
        raise ValueError(f"part must be 'call' or 'answer', not {part!r}")
    rng = random.Random(30_000 + seed)
    right = total = 0
    for _ in range(n):
        msgs, tools = copy_corpus.chat_messages(rng, copy_corpus.NAMED_STYLES)
        text = copy_corpus.chat_text(tok, msgs, tools)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = []
        if part == "answer":
            at = text.rindex("<answer>") + len("<answer>")
            spans.append((at, text.index("</answer>", at)))
        call_at = text.find("<tool_call>", text.find("<|im_start|>assistant\n"))
        for v in msgs[-3]["tool_calls"][0]["function"]["arguments"].values() if part == "call" else ():
            needle = json.dumps(v, ensure_ascii=False)
            at = text.find(needle, call_at)
            spans.append((at + (1 if needle.startswith('"') else 0), at + len(needle) - (1 if needle.startswith('"') else 0)))
        ids = torch.tensor([enc["input_ids"]], device=model.device)
        with torch.no_grad():
            pred = model(input_ids=ids).logits[0].argmax(-1)
        for i, (a, _) in enumerate(enc["offset_mapping"]):
            if i > 0 and any(s <= a < e for s, e in spans):
                total += 1
                right += int(pred[i - 1] == ids[0, i])
    return right / max(1, total)


def repeat_check(model: Any, tok: Any, seed: int, n: int = 20) -> float:
    """The share of `n` held-out "Repeat after me: ..." lines (values drawn from another seed) that
    greedy decoding repeats exactly: the plainest form of copying."""
    import torch

    rng = random.Random(20_000 + seed)
    right = 0
    for _ in range(n):
        line = " ".join(str(copy_corpus.value(rng, rng.choice(["number", "word", "name"]))) for _ in range(4))
        ids = tok(f"Repeat after me: {line}\n", return_tensors="pt")["input_ids"].to(model.device)
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=len(tok(line)["input_ids"]) + 2, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        right += tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True).split("\n")[0].strip() == line
    return right / n


def _parse_call(text: str) -> dict[str, Any] | None:
    start, end = text.find("<tool_call>"), text.find("</tool_call>")
    if start < 0 or end < start:
        return None
    try:
        got = json.loads(text[start + len("<tool_call>"):end])
    except ValueError:
        return None
    return got if isinstance(got, dict) else None
