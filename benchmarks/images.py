"""Images benchmark (issue 31): image trajectories of the tiny VLM against text-only trajectories
of the same token count, in one run.

Setup: rlfactory's `tiny-vl:1m` (Qwen2.5-VL architecture, 1.2M parameters) on CPU, its
`qwen2_5_vl` ToolManager as the pixel source. Each trajectory: a prompt with one picture
(--prompt-px, square), then 3 model turns of --new-tokens tokens each (sampled at temperature 1,
no stop token, so every turn has exactly that many), with an observation holding one picture
(--obs-px) after turns 1 and 2. All trajectories run concurrently through one LocalGenerator
(continuous batching, each trajectory's KV cache kept between its turns), as the rollout engine
drives it. The text-only twin of a trajectory is the same token ids with every image pad replaced
by an ordinary text token (seeded random ids) and no images: same length, same turns, same
number of generated tokens; only the pictures differ.

Figures, all measured in this run (the fastest of --repeats runs each, modes alternating, and the
ratio of the medians; every run's seconds are printed too, with the generator's busy seconds, the collate's share and the
vision tower's forward seconds (hooks on it; its backward is not split out)):
  rollout tokens/s        trajectory tokens (prompt + observations + generated) / wall seconds of
                          the concurrent 3-turn rollout; and generated tokens / wall; image / text
  training tokens/s       trajectory tokens / seconds of one update's work on the rollout's
                          trajectories: collate (pixels from the image processor) + forward with
                          gradients + backward, in micro-batches of --micro-batch rows; image / text
  pixel memory per step   bytes of the pixel values the training batch holds (all rows' images,
                          alive for the whole update: its peak) and those the generator's pixel
                          cache holds after the rollout; beside the batch's token tensors
  per CPU second          the same ratios in tokens per process CPU second (medians): the work
                          itself, which other jobs on a shared machine disturb far less than wall time
  vision-encoder calls    forwards of the vision tower during the rollout and the images they
                          covered, against the trajectories' images, their image-bearing turns and
                          the decode steps: each image is encoded once, in the prefill of its turn

The machine may be shared: the load average is printed at start and end.

Run:  .venv/bin/python benchmarks/images.py [--trajectories 32] [--new-tokens 24] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch
from PIL import Image as PILImage

from rlfactory.config import ModelConfig, SamplingConfig
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.model_source import load_model
from rlfactory.images import Image, image_from_pil
from rlfactory.protocols import GenRequest
from rlfactory.serve.served import pixel_source
from rlfactory.tools.base import ToolResult
from rlfactory.train.batch import TrainBatch, collate, micro_batches
from rlfactory.train.logprobs import policy_forward
from rlfactory.trajectory import Segment, Trajectory

TURNS = 3


@dataclass
class Plan:
    """One trajectory's fixed inputs: prompt ids and images, each observation's ids and images."""

    prompt: list[int]
    prompt_images: list[Image]
    observations: list[tuple[list[int], list[Image]]]


def pictures(k: int, px: int, salt: int) -> Image:
    """A square picture of `px` pixels, distinct per (k, salt): a gradient in a colour of its own."""
    g = torch.Generator().manual_seed(1000 * salt + k)
    base = torch.randint(0, 256, (3,), generator=g)
    ramp = torch.linspace(0, 60, px).round().to(torch.uint8)
    arr = (base.view(1, 1, 3).to(torch.int16) + ramp.view(px, 1, 1) - ramp.view(1, px, 1)).clamp(0, 255)
    return image_from_pil(PILImage.fromarray(arr.to(torch.uint8).numpy(), "RGB"))


def plans(tm, n: int, prompt_px: int, obs_px: int) -> list[Plan]:
    out = []
    for k in range(n):
        prompt = tm.render_prompt_images([{"role": "user", "content": [
            {"type": "text", "text": f"Picture {k}: what is in it?"}, {"type": "image", "image": pictures(k, prompt_px, 0)}]}], [])
        obs = [tm.render_observation_images([ToolResult(f"zoom {t} of picture {k}", images=[pictures(k, obs_px, t + 1)])])
               for t in range(TURNS - 1)]
        out.append(Plan(prompt.ids, prompt.images, [(o.ids, o.images) for o in obs]))
    return out


def text_twin(plan: Plan, pad_id: int, filler: torch.Tensor, seed: int) -> Plan:
    """`plan` with every image pad replaced by a random ordinary token, and no images."""
    g = torch.Generator().manual_seed(seed)

    def swap(ids: list[int]) -> list[int]:
        return [int(filler[torch.randint(len(filler), (1,), generator=g)]) if t == pad_id else t for t in ids]

    return Plan(swap(plan.prompt), [], [(swap(ids), []) for ids, _ in plan.observations])


async def roll(gen: LocalGenerator, plan: Plan, k: int, new_tokens: int) -> Trajectory:
    segments = [Segment("prompt", list(plan.prompt), images=list(plan.prompt_images) or None)]
    for turn in range(TURNS):
        ids = [t for s in segments for t in s.token_ids]
        images = [im for s in segments for im in s.images or ()]
        res = await gen.submit(GenRequest(ids, new_tokens, SamplingConfig(temperature=1.0), stop_token_ids=[],
                                          session=f"t{k}", seed=100 * k + turn, images=images or None))
        segments.append(Segment("model", res.token_ids, logprobs=res.logprobs))
        if turn < TURNS - 1:
            obs_ids, obs_images = plan.observations[turn]
            segments.append(Segment("observation", list(obs_ids), images=list(obs_images) or None))
    gen.forget(f"t{k}")
    return Trajectory(f"t{k}-0", f"t{k}", segments=segments)


class EncoderWatch:
    """Counts the vision tower's forwards, the images they cover and their seconds (a `with` block)."""

    def __init__(self, model) -> None:
        self.visual, self.grids, self.seconds, self._t0 = model.model.visual, [], 0.0, 0.0

    def __enter__(self) -> "EncoderWatch":
        def before(m, args, kwargs):
            self._t0 = time.perf_counter()

        def after(m, args, kwargs, out):
            self.seconds += time.perf_counter() - self._t0
            self.grids.append(kwargs["grid_thw"])

        self._hooks = [self.visual.register_forward_pre_hook(before, with_kwargs=True),
                       self.visual.register_forward_hook(after, with_kwargs=True)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._hooks:
            h.remove()

    @property
    def images(self) -> int:
        return sum(len(g) for g in self.grids)


@dataclass
class Rollout:
    trajs: list[Trajectory]
    wall_s: float
    stats: dict[str, float]
    encoder_calls: int
    encoded_images: int
    encoder_s: float
    cache_bytes: int
    cpu_s: float
    """Process CPU seconds (all threads) of the rollout: the work, less sensitive than wall time
    to other jobs on a shared machine."""


def rollout(model, tm, pad_id: int, batch_plans: list[Plan], new_tokens: int) -> Rollout:
    gen = LocalGenerator(model, pad_id, pixels=tm, seed=0)

    async def main():
        return await asyncio.gather(*(roll(gen, p, k, new_tokens) for k, p in enumerate(batch_plans)))

    try:
        with EncoderWatch(model) as enc:
            t0, c0 = time.perf_counter(), time.process_time()
            trajs = asyncio.run(main())
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        gen.close()
    cached = gen.loop.prefill.vision.cache_bytes() if gen.loop.prefill.vision is not None else 0
    return Rollout(list(trajs), wall, dict(gen.stats), len(enc.grids), enc.images, enc.seconds, cached, cpu)


def train_pass(model, tm, pad_id: int, trajs: list[Trajectory], micro: int
               ) -> tuple[float, float, float, TrainBatch, float]:
    """(seconds of collate + forward with gradients + backward over `trajs`, of collate alone, of
    the vision tower's forwards, the batch, process CPU seconds of it all); the gradients are dropped."""
    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    batch = collate(trajs, pad_id, pixels=tm)
    collate_s = time.perf_counter() - t0
    with EncoderWatch(model) as enc:
        for idx in micro_batches(torch.arange(len(batch)), micro):
            mb = batch.select(idx)
            logp, _ = policy_forward(model, mb)
            (-(logp * mb.loss_mask).sum() / max(float(mb.loss_mask.sum()), 1.0)).backward()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    model.zero_grad(set_to_none=True)
    model.eval()
    return seconds, collate_s, enc.seconds, batch, cpu


def pixel_bytes(batch: TrainBatch) -> int:
    rows = ([] if batch.images is None else batch.images.prompts + batch.images.completions)
    return sum(r.values.nbytes + r.grids.nbytes for r in rows if r is not None)


def token_bytes(batch: TrainBatch) -> int:
    return sum(t.nbytes for t in (batch.prompt_ids, batch.prompt_mask, batch.prompt_index, batch.completion_ids,
                                  batch.completion_mask, batch.loss_mask, batch.sampler_logprobs))


def tokens(trajs: list[Trajectory]) -> tuple[int, int]:
    """(all trajectory tokens, generated tokens)."""
    return (sum(len(s.token_ids) for t in trajs for s in t.segments),
            sum(len(s.token_ids) for t in trajs for s in t.segments if s.role == "model"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--prompt-px", type=int, default=64, help="prompt picture side (64 px: 64 image tokens)")
    ap.add_argument("--obs-px", type=int, default=32, help="observation picture side (32 px: 16 image tokens)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model, tok = load_model(ModelConfig(path="tiny-vl:1m"), "cpu")
    model.eval()
    tm = pixel_source(model, tok)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    n_params = sum(p.numel() for p in model.parameters())
    print(f"images benchmark: {args.trajectories} trajectories x {TURNS} turns x {args.new_tokens} new tokens; tiny-vl:1m "
          f"({n_params / 1e6:.2f}M params), CPU ({os.cpu_count()} cores), torch threads {args.threads}; python "
          f"{platform.python_version()}, torch {torch.__version__}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at start")

    image_plans = plans(tm, args.trajectories, args.prompt_px, args.obs_px)
    special = set(tok.all_special_ids) | set(tok.get_added_vocab().values())
    filler = torch.tensor([i for i in range(256, min(len(tok), 4096)) if i not in special])
    text_plans = [text_twin(p, tm.pad_id, filler, k) for k, p in enumerate(image_plans)]
    n_pads = sum(p.prompt.count(tm.pad_id) + sum(ids.count(tm.pad_id) for ids, _ in p.observations) for p in image_plans)
    n_images = sum(len(p.prompt_images) + sum(len(ims) for _, ims in p.observations) for p in image_plans)
    print(f"pictures: prompt {args.prompt_px}x{args.prompt_px} px, observations {args.obs_px}x{args.obs_px} px; "
          f"{n_images} images = {n_pads} image tokens in all (text twin: as many random text tokens)")

    rollout(model, tm, pad_id, image_plans[:4], 4)  # warm-up (first forwards, allocator)
    rollout(model, tm, pad_id, text_plans[:4], 4)
    rolls: dict[str, list[Rollout]] = {"image": [], "text": []}
    trains: dict[str, list[tuple[float, float, float, TrainBatch, float]]] = {"image": [], "text": []}
    for rep in range(args.repeats):
        for mode, batch_plans in (("image", image_plans), ("text", text_plans)):
            r = rollout(model, tm, pad_id, batch_plans, args.new_tokens)
            train_s, collate_s, enc_s, batch, train_cpu = train_pass(model, tm, pad_id, r.trajs, args.micro_batch)
            print(f"  [{rep + 1}/{args.repeats}] {mode:5s} rollout {r.wall_s:5.2f} s (CPU {r.cpu_s:5.2f} s, generator "
                  f"busy {r.stats['busy_s']:.2f} s, vision encoder {r.encoder_s:.2f} s), training {train_s:5.2f} s "
                  f"(CPU {train_cpu:5.2f} s, collate {collate_s:.2f} s, vision encoder forwards {enc_s:.2f} s)")
            rolls[mode].append(r)
            trains[mode].append((train_s, collate_s, enc_s, batch, train_cpu))
    best = {m: (min(rolls[m], key=lambda r: r.wall_s), *min(trains[m], key=lambda x: x[0])) for m in rolls}

    print()
    print(f"{'mode':6s} {'traj tok':>9s} {'gen tok':>8s} {'rollout s':>10s} {'tok/s':>9s} {'gen tok/s':>10s} "
          f"{'train s':>8s} {'train tok/s':>12s} {'decode steps':>13s} {'prefills':>9s}")
    rates = {}
    for mode in ("image", "text"):
        r, train_s, _, _, batch, _ = best[mode]
        all_tok, gen_tok = tokens(r.trajs)
        rates[mode] = (all_tok / r.wall_s, gen_tok / r.wall_s, batch.num_tokens() / train_s)
        print(f"{mode:6s} {all_tok:9d} {gen_tok:8d} {r.wall_s:10.2f} {rates[mode][0]:9.0f} {rates[mode][1]:10.0f} "
              f"{train_s:8.2f} {rates[mode][2]:12.0f} {int(r.stats['steps']):13d} {int(r.stats['prefills']):9d}")
    assert tokens(best["image"][0].trajs) == tokens(best["text"][0].trajs), "the twins must have the same token counts"
    ri, rt = rates["image"], rates["text"]
    print(f"image / text: rollout tokens/s {ri[0] / rt[0]:.2f}x (generated tokens/s {ri[1] / rt[1]:.2f}x), "
          f"training tokens/s {ri[2] / rt[2]:.2f}x")
    med = {m: (statistics.median(r.wall_s for r in rolls[m]), statistics.median(t[0] for t in trains[m])) for m in rolls}
    enc = statistics.median(r.encoder_s for r in rolls["image"]), statistics.median(t[2] for t in trains["image"])
    cpu = {m: (statistics.median(r.cpu_s for r in rolls[m]), statistics.median(t[4] for t in trains[m])) for m in rolls}
    print(f"image / text in tokens per CPU second (medians; the work, whatever else runs): rollout "
          f"{cpu['text'][0] / cpu['image'][0]:.2f}x, training {cpu['text'][1] / cpu['image'][1]:.2f}x")
    print(f"image / text, medians of the {args.repeats} runs: rollout tokens/s {med['text'][0] / med['image'][0]:.2f}x, "
          f"training tokens/s {med['text'][1] / med['image'][1]:.2f}x; the vision encoder's forwards took "
          f"{enc[0]:.2f} s of the image rollout's {med['image'][0]:.2f} s and {enc[1]:.2f} s of its update's "
          f"{med['image'][1]:.2f} s")

    r, _, _, _, batch, _ = best["image"]
    px, tk = pixel_bytes(batch), token_bytes(batch)
    print(f"pixel memory per step: the training batch holds {px / 2**20:.2f} MiB of pixel values for {n_images} images "
          f"({px / n_images / 2**10:.1f} KiB per image; its token tensors: {tk / 2**20:.2f} MiB; text twin's pixels: "
          f"{pixel_bytes(best['text'][4])} B); the generator's pixel cache after the rollout: {r.cache_bytes / 2**20:.2f} MiB")
    image_turns = sum(1 for t in r.trajs for s in t.segments if s.images)
    print(f"vision encoder in the rollout: {r.encoder_calls} forwards covering {r.encoded_images} images, for "
          f"{n_images} images in {image_turns} image-bearing segments; {int(r.stats['steps'])} decode steps "
          f"-> {r.encoded_images / n_images:.2f} encodings per image, "
          f"{r.encoded_images / (args.trajectories * TURNS):.2f} per trajectory turn "
          f"({n_images / (args.trajectories * TURNS):.2f} images per trajectory turn)")
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at end")
    return 0 if r.encoded_images == n_images else 1


if __name__ == "__main__":
    sys.exit(main())
