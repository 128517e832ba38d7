"""Warm start: supervised fine-tuning on demonstrations that an env's own solver writes.

A demonstration is a chat conversation (system/user, then assistant turns with tool calls, the
tools' real results, and a final answer). It is turned into a Trajectory through the same
ToolManager that rollouts use: the prompt is `render_prompt`, each assistant turn is the exact
token ids the model would sample (`model_turn_ids`), each tool turn is `render_observation`.
So the loss mask is built the same way as in RL, and only model tokens are learned, except in
the first `full_text_steps` steps, which learn the whole text (`full_text_view`).

Images (issue 31): with a vision-language ToolManager the prompt's image parts and a tool
message's image parts (content `[{"type": "text", ...}, {"type": "image", "image": ...}]`) stay
on their segments, rendered with their pads exactly as a rollout renders them (a tool message's
parts become the ToolResult a Python tool returning `[text, picture]` gives), and `sft_train`
feeds their pixels to the forward.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from rlfactory.chat.template import ModelTurn
from rlfactory.chat.vision import VisionToolManager, is_image_part
from rlfactory.images import ImageError, image_from_value
from rlfactory.tools.function import result_from_value
from rlfactory.trajectory import Segment, Trajectory
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec
from rlfactory.train.batch import TrainBatch, collate
from rlfactory.train.batch_images import PixelSource
from rlfactory.train.data import step_generator
from rlfactory.train.logprobs import policy_forward
from rlfactory.train.parallel import RowLayout
from rlfactory.config import SftConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlfactory.chat.base import ToolManager
    from rlfactory.envs.base import Env


def _arguments(raw: Any) -> dict[str, Any]:
    return json.loads(raw) if isinstance(raw, str) else dict(raw or {})


GUESSES = "guesses"
"""`Trajectory.info` key of a demonstration: the indexes of its segments that hold guessed text
(an assistant message's `guess`), which no SFT step learns, full-text steps included."""


def _segment_spans(messages: list[dict[str, Any]], first: int) -> list[tuple[int, int]]:
    """The message span each segment of `demo_to_trajectory` renders: the prompt, each assistant
    message, each run of tool messages that the model speaks after."""
    spans, i = [(0, first)], first
    while i < len(messages):
        j = i + 1
        if messages[i]["role"] == "tool":
            while j < len(messages) and messages[j]["role"] == "tool":
                j += 1
            if j == len(messages):
                break
        spans.append((i, j))
        i = j
    return spans


def demo_to_trajectory(messages: list[dict[str, Any]], tool_manager: ToolManager, tools: Sequence[ToolSpec],
                       demo_id: str = "demo", reuse: tuple[list[dict[str, Any]], Trajectory] | None = None) -> Trajectory:
    """The token-level trajectory of one demonstration conversation. `reuse`: a demonstration
    already rendered with the same ToolManager and tools (its messages and trajectory); the
    segments of messages it shares at the same places are taken from it, not rendered again."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError(f"demonstration {demo_id}: no assistant turn")
    done: dict[tuple[int, int], Segment] = {}
    if reuse is not None and not reuse[1].info.get(GUESSES):  # (a guess's turn is split in several segments)
        old, traj = reuse
        old_first = next(i for i, m in enumerate(old) if m["role"] == "assistant")
        done = {span: seg for span, seg in zip(_segment_spans(old, old_first), traj.segments, strict=True)
                if messages[span[0]:span[1]] == old[span[0]:span[1]]}
    vision = isinstance(tool_manager, VisionToolManager)
    segments, guesses = [], []
    spans = _segment_spans(messages, first)
    for i, j in spans:
        if (i, j) in done:
            segments.append(done[(i, j)])
        elif i == 0 and vision:
            prompt = tool_manager.render_prompt_images(messages[:first], tools)
            segments.append(Segment("prompt", prompt.ids, images=prompt.images or None))
        elif i == 0:
            segments.append(Segment("prompt", tool_manager.render_prompt(messages[:first], tools)))
        elif messages[i]["role"] == "assistant":
            turn = _assistant_segments(messages[i], tool_manager, demo_id)
            guesses += [len(segments) + k for k, seg in enumerate(turn) if seg.role == "observation"]
            segments.extend(turn)
        elif messages[i]["role"] == "tool":
            results = [_tool_result(m["content"], demo_id) for m in messages[i:j]]
            if vision:
                obs = tool_manager.render_observation_images(results)
                segments.append(Segment("observation", obs.ids, images=obs.images or None))
            else:
                segments.append(Segment("observation", tool_manager.render_observation(results)))
        else:
            raise ValueError(f"demonstration {demo_id}: unexpected {messages[i]['role']!r} message after the first assistant turn")
    turns = sum(messages[i]["role"] == "assistant" for i, _ in spans)
    return Trajectory(id=demo_id, group=demo_id, segments=segments, turns=turns, info={GUESSES: guesses} if guesses else {})


def _assistant_segments(m: dict[str, Any], tool_manager: ToolManager, demo_id: str) -> list[Segment]:
    """The model segment of one assistant message; for a message with `guess` (the part of its
    content that is a guess, e.g. an answer given without searching), the guessed tokens as an
    observation segment between the turn's other tokens, so that SFT learns the turn (answer at
    once, in the right format) but not the guessed value (Env.solve)."""
    calls = [ToolCall(c["function"]["name"], _arguments(c["function"].get("arguments"))) for c in m.get("tool_calls") or []]
    content = m.get("content") or ""
    ids = tool_manager.model_turn_ids(ModelTurn(calls=calls, content=content))
    guess = m.get("guess")
    if not guess:
        return [Segment("model", ids)]
    if not isinstance(guess, str) or guess not in content:
        raise ValueError(f"demonstration {demo_id}: an assistant message's guess {guess!r} is not part of its content")
    bare = tool_manager.model_turn_ids(ModelTurn(calls=calls, content=content.replace(guess, "", 1)))
    head = next((k for k, (a, b) in enumerate(zip(ids, bare)) if a != b), min(len(ids), len(bare)))
    tail = next((k for k, (a, b) in enumerate(zip(ids[head:][::-1], bare[head:][::-1])) if a != b),
                min(len(ids), len(bare)) - head)
    middle = ids[head:len(ids) - tail]
    if not middle:
        return [Segment("model", ids)]
    return [s for s in (Segment("model", ids[:head]), Segment("observation", middle),
                        Segment("model", ids[len(ids) - tail:])) if s.token_ids]


def _tool_result(content: Any, demo_id: str) -> ToolResult:
    """A tool message's content as the result the rollout would render: text, or a list of text
    and image parts (as a Python tool returning `[text, picture]`)."""
    if not isinstance(content, list):
        return ToolResult(text=str(content))
    values: list[Any] = []
    for part in content:
        if is_image_part(part):
            try:
                values.append(image_from_value(part))
            except ImageError as e:
                raise ValueError(f"demonstration {demo_id}: a tool message's image: {e}") from None
        else:
            values.append(str(part.get("text", "")) if isinstance(part, dict) else str(part))
    return result_from_value(values) if any(not isinstance(v, str) for v in values) else ToolResult(text="\n".join(values))


def demo_calls(messages: list[dict[str, Any]]) -> list[ToolCall]:
    """The tool calls of a demonstration's assistant turns, in order."""
    return [ToolCall(c["function"]["name"], _arguments(c["function"].get("arguments")))
            for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]


def demo_problem(calls: Sequence[ToolCall], tools: Sequence[ToolSpec]) -> str | None:
    """Why a demonstration's calls are not calls the model could make with `tools` (a tool name
    they do not include, arguments the tool's schema refuses), or None."""
    from rlfactory.config import did_you_mean
    from rlfactory.tools.validation import ArgumentValidator

    by_name = {t.name: t for t in tools}
    for call in calls:
        spec = by_name.get(call.name)
        if spec is None:
            return (f"calls tool {call.name!r}, which the run's tools do not include{did_you_mean(call.name, by_name)} "
                    f"(tools: {', '.join(by_name) or 'none'})")
        validator = ArgumentValidator.for_schema(spec.name, spec.parameters)
        problem = validator.error(call.arguments) if validator is not None else None
        if problem is not None:
            return f"calls {call.name!r} with arguments its schema refuses: {problem}"
    return None


class Demonstrations(Sequence[Trajectory]):
    """The demonstrations `write_demonstrations` wrote, as trajectories. Iterating gives them as
    written; indexing (what `sft_train` does for each visit) gives the env's variant of one where
    the env rewrites demonstrations (`Env.augment_demo`), re-rendered through the run's
    ToolManager, each visit with its own generator seeded from `seed` and the visit count (so a
    run's batches stay reproducible), and the written one otherwise."""

    def __init__(self, env: Env, tool_manager: ToolManager, seed: int = 0) -> None:
        self.tool_manager, self.seed = tool_manager, seed
        self.augment = getattr(env, "augment_demo", None)
        self._written: list[tuple[dict[str, Any], list[dict[str, Any]], Sequence[ToolSpec], Trajectory]] = []
        self.visits = 0
        self.augmented = 0
        """Visits that trained on a variant (for the run's log)."""

    def add(self, row: dict[str, Any], messages: list[dict[str, Any]], tools: Sequence[ToolSpec], traj: Trajectory) -> None:
        self._written.append((row, messages, tools, traj))

    def __len__(self) -> int:
        return len(self._written)

    def __iter__(self):
        return (w[3] for w in self._written)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [w[3] for w in self._written[i]]
        row, messages, tools, traj = self._written[i]
        if self.augment is None:
            return traj
        rng = random.Random(f"augment:{self.seed}:{self.visits}")
        self.visits += 1
        variant = self.augment(row, messages, rng)
        if variant is None:
            return traj
        self.augmented += 1
        return demo_to_trajectory(variant, self.tool_manager, tools, demo_id=traj.id, reuse=(messages, traj))


def write_demonstrations(env: Env, tool_manager: ToolManager, tools: Sequence[ToolSpec], n: int,
                         env_label: str | None = None, seed: int = 0) -> Demonstrations:
    """`n` demonstrations from the env's train split (rows cycled), skipping rows the solver cannot
    solve (it raises ValueError/RuntimeError for those). A demonstration that calls a tool the run
    does not have, or with arguments its schema refuses, is a ConfigError naming the row: the
    model would be taught calls that can only fail. `seed` seeds the env's per-visit variants
    (`Demonstrations`)."""
    from rlfactory.config import ConfigError
    from rlfactory.rollout.engine import row_tool_specs

    label = env_label or getattr(env, "name", "env")
    rows = env.load_split("train")
    if not rows:
        raise ValueError(f"env {label!r}: empty train split, nothing to demonstrate")
    demos = Demonstrations(env, tool_manager, seed)
    skipped = 0
    for k in range(n):
        row = rows[k % len(rows)]
        try:
            messages = env.solve(row)
        except (ValueError, RuntimeError):
            skipped += 1
            continue
        row_tools = row_tool_specs(row, list(tools)) if isinstance(row, dict) else tools  # a row's own `tools`
        problem = demo_problem(demo_calls(messages), row_tools)
        if problem is not None:
            ident = f" (id {row['id']!r})" if isinstance(row, dict) and "id" in row else ""
            raise ConfigError(f"env {label!r}: solve() of train row {k % len(rows)}{ident} {problem}")
        demos.add(row, messages, row_tools, demo_to_trajectory(messages, tool_manager, row_tools, demo_id=f"demo-{k}"))
    if not len(demos):
        raise ValueError(f"env {env.name!r}: the solver could not solve any of {n} rows")
    return demos


def full_text_view(traj: Trajectory, image_token_id: int | None = None) -> Trajectory:
    """`traj` with every token after the first as one model segment (for loss on the whole text).
    With images, each run of image pads (`image_token_id`, the model's) stays out of the loss as an
    observation segment, the images of its original segment on the first such run (in order). A
    demonstration's guessed text (`info["guesses"]`: its segment indexes) stays out of it too
    (demonstrations without images; with images, only their pads stay out)."""
    ids = traj.input_ids
    guesses = set(traj.info.get(GUESSES) or ())
    if guesses and not traj.images():
        segments, run = [Segment("prompt", ids[:1])], list(ids[1:len(traj.segments[0].token_ids)])
        for k, seg in enumerate(traj.segments[1:], start=1):
            if k in guesses:
                segments += [Segment("model", run)] if run else []
                segments.append(Segment("observation", list(seg.token_ids)))
                run = []
            else:
                run += seg.token_ids
        segments += [Segment("model", run)] if run else []
        return Trajectory(id=traj.id, group=traj.id, segments=segments, turns=1)
    if not traj.images():
        return Trajectory(id=traj.id, group=traj.id, segments=[Segment("prompt", ids[:1]), Segment("model", ids[1:])],
                          turns=1)
    if image_token_id is None:
        raise ValueError(f"demonstration {traj.id} holds images: its full-text view needs the model's image token id")
    owner = [k for k, s in enumerate(traj.segments) for _ in s.token_ids]
    segments, attached = [Segment("prompt", ids[:1])], set()
    for is_pad, run in itertools.groupby(range(1, len(ids)), key=lambda i: ids[i] == image_token_id):
        cols = list(run)
        if not is_pad:
            segments.append(Segment("model", [ids[i] for i in cols]))
            continue
        k = owner[cols[0]]
        images = traj.segments[k].images if k not in attached else None
        attached.add(k)
        segments.append(Segment("observation", [ids[i] for i in cols], images=images))
    return Trajectory(id=traj.id, group=traj.id, segments=segments, turns=1)


def _lr_factor(step: int, cfg: SftConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    if cfg.lr_schedule == "wsd":
        start = cfg.steps - cfg.decay_steps
        return 1.0 if step < start else 1.0 - 0.9 * min(1.0, (step - start) / cfg.decay_steps)
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 1.0 - 0.9 * min(1.0, frac)


def sft_train(model: torch.nn.Module, demos: Sequence[Trajectory], pad_id: int, cfg: SftConfig,
              log=None, pixels: PixelSource | None = None) -> list[dict[str, float]]:
    """Train `model` in place on `demos` (masked NLL on model tokens; on every token during the first
    `cfg.full_text_steps` steps). `pixels`: the VL ToolManager that turns the demos' images into
    the model's pixel inputs. Returns per-step metrics."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    device = next(model.parameters()).device
    image_token = getattr(model.config, "image_token_id", None)  # vision-language models only
    model.train()
    history = []
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        g = step_generator(cfg.seed, step, "sft")
        idx = torch.randint(len(demos), (min(cfg.batch_size, len(demos)),), generator=g).tolist()
        full_text = step < cfg.full_text_steps
        chosen = [full_text_view(demos[i], image_token) if full_text else demos[i] for i in idx]
        batch = collate(chosen, pad_id, pixels).to(device)
        total = batch.loss_mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss, right = 0.0, 0.0
        for sub in sft_passes(batch, cfg):
            logp, _ = policy_forward(model, sub, bf16=cfg.bf16)
            mask = sub.loss_mask
            part = -(logp * mask).sum() / total
            part.backward()
            loss += part.item()
            with torch.no_grad():
                right += float(((logp.exp() > 0.5).float() * mask).sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
        row = {"step": step + 1, "loss": loss, "token_acc": right / float(total), "grad_norm": float(grad_norm),
               "lr": sched.get_last_lr()[0], "full_text": full_text, "tokens_per_s": batch.num_tokens() / (time.perf_counter() - t0)}
        if not math.isfinite(row["loss"]):
            raise FloatingPointError(f"sft step {step + 1}: loss is {row['loss']}")
        history.append(row)
        if log is not None:
            log(row)
    model.eval()
    return history


def sft_passes(batch: TrainBatch, cfg: SftConfig) -> list[TrainBatch]:
    """The forward/backward passes of one SFT step: `batch` whole, or (`cfg.group_by_length`) its
    rows in passes of similar length that compute fewer padded positions in all, planned as the RL
    update plans its passes (`RowLayout.micro_batches`); each pass keeps only the padding its own
    rows need."""
    rows = torch.arange(len(batch))
    plan = RowLayout.single(batch).micro_batches(rows, None, cfg.micro_batch_tokens, by_length=cfg.group_by_length)
    return [batch] if len(plan) == 1 else [batch.select(p) for p in plan]


def save_model_atomically(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: str | Path) -> Path:
    """save_pretrained into a temporary sibling folder, then rename over `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    from rlfactory.chat.qwen_vl import save_image_processor

    save_image_processor(tokenizer, tmp)  # a vision-language model's pixels need it
    old = out.parent / f".old-{out.name}-{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out
