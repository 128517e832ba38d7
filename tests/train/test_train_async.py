"""Asynchronous, off-policy training (trainer.max_staleness): staleness 0 is the synchronous
trainer bit for bit; stale segments are weighted by the behaviour logprobs (decoupled PPO) on
hand-computed values; trajectories beyond the bound are dropped and counted; a real run with
max_staleness 1 trains and resumes."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import pytest
import torch

from rlfactory.cli.main import main
from rlfactory.config import RunConfig, load_config
from rlfactory.rewards.rule import RuleReward
from rlfactory.train.async_pipeline import AsyncPipeline, OffPolicyGeneration, split_threads
from rlfactory.train.staleness import fresh_mask, staleness_of
from rlfactory.train.loop import Trainer
from rlfactory.train.runlog import read_metrics
from train_fixtures import make_traj, run_config, tiny_qwen3

TIMING = ("time/", "perf/")


class _FixedEngine:
    """Unit-test stand-in for the rollout engine: returns hand-built trajectories."""

    def __init__(self, trajs):
        self.trajs = trajs

    async def run(self, rows, n, policy_version=0, *, seeds=None, priority=0):
        return self.trajs


def _versioned(parts, versions, group, tid, lp):
    """A trajectory whose model segments carry `versions` (in order) and sampler logprob `lp`."""
    traj = make_traj(parts, group, tid, lp)
    models = [s for s in traj.segments if s.role == "model"]
    for seg, v in zip(models, versions):
        seg.policy_version = v
    return traj


def _trainer(tmp_path, trajs, **trainer):
    model = tiny_qwen3()
    session = SimpleNamespace(engine=_FixedEngine(trajs), generator=SimpleNamespace(model=model), model=model,
                              tokenizer=SimpleNamespace(pad_token_id=0), tool_manager=None, runner=None, env=None)
    cfg = load_config(RunConfig, run_config(tmp_path, algo={"group_size": 2},
                                            trainer={"prompts_per_step": 2, **trainer}))
    reward = RuleReward({"train_fixtures:first_token_even": 1.0})
    return Trainer(cfg, session, reward, train_rows=[{"id": 0}, {"id": 1}])


def test_staleness_of_is_the_oldest_model_segment():
    t = _versioned([("prompt", [1]), ("model", [2]), ("observation", [3]), ("model", [4])], [5, 3], "g", "t", -1.0)
    assert staleness_of(t, 6) == 3
    fresh, m = fresh_mask([t], 6, max_staleness=2)
    assert not fresh.item() and m["async/dropped_stale"] == 1
    assert m["async/staleness_max"] == 3 and m["async/staleness_mean"] == 2 and m["async/trajs_staleness_3"] == 1


def test_stale_trajectories_beyond_k_are_dropped_and_counted(tmp_path):
    prompt = ("prompt", [1, 2])
    # Trained version: 2; k = 1. "a" is current, "b" a partial rollout whose first turn is one
    # version behind (kept), "c" has a turn two versions behind (dropped), "d" is current.
    trajs = [
        _versioned([prompt, ("model", [60, 61])], [2], "g0", "a", -1.0),
        _versioned([prompt, ("model", [5]), ("observation", [9]), ("model", [7])], [1, 2], "g0", "b", -1.0),
        _versioned([prompt, ("model", [8, 7]), ("observation", [9]), ("model", [6])], [0, 2], "g1", "c", -1.0),
        _versioned([prompt, ("model", [4, 3])], [2], "g1", "d", -1.0),
    ]
    trainer = _trainer(tmp_path, trajs, max_staleness=1)
    trainer.progress.version = 2
    metrics, out = asyncio.run(trainer.step(1))
    assert metrics["async/dropped_stale"] == 1 and metrics["batch/kept"] == 3
    assert metrics["async/trajs_staleness_0"] == 2 and metrics["async/trajs_staleness_1"] == 1
    assert metrics["async/trajs_staleness_2"] == 1 and metrics["async/staleness_max"] == 2
    assert out[2].advantage is None  # not trained on
    # c is out of its group's baseline too: d is alone there, so its advantage is 0
    assert out[3].advantage == 0.0
    assert out[0].advantage == -out[1].advantage != 0
    assert metrics["policy_version"] == 3


def _is_case(tmp_path, max_staleness):
    # One group of two sampled by version 0, trained at version `max_staleness`. Sampler
    # logprobs: -0.5 on one trajectory (the trainer's are lower: weights < 1) and -9.0 on the other
    # (weights far above the cap, truncated to it).
    prompt = ("prompt", [1, 2])
    trajs = [_versioned([prompt, ("model", [60, 61, 62])], [0], "g0", "a", -9.0),
             _versioned([prompt, ("model", [5, 3])], [0], "g0", "b", -0.5)]
    tmp_path.mkdir()
    trainer = _trainer(tmp_path, trajs, max_staleness=max_staleness, prompts_per_step=1)
    trainer.cfg.algo.tis_cap = 2.0
    trainer.progress.version = max_staleness
    return asyncio.run(trainer.step(1))


def test_a_stale_turn_is_weighted_by_the_behaviour_logprobs_hand_computed(tmp_path):
    metrics, out = _is_case(tmp_path / "k1", max_staleness=1)
    assert metrics["async/dropped_stale"] == 0 and metrics["async/trajs_staleness_1"] == 2
    # Hand computation from what the trainer recorded: its logprobs before the update (pi_old),
    # the sampler's (pi_behaviour) and each trajectory's advantage. One on-policy pass: the PPO
    # ratio against pi_old is 1, so the token-mean loss is -sum(A_b * w_bt) / tokens, with
    # w = min(pi_old / pi_behaviour, 2).
    terms, weights = [], []
    for t in out:
        (seg,) = [s for s in t.segments if s.role == "model"]
        for old, behaviour in zip(seg.trainer_logprobs, seg.logprobs):
            w = min(math.exp(old - behaviour), 2.0)
            weights.append((w, math.exp(old - behaviour)))
            terms.append(-t.advantage * w)
    assert out[0].advantage == -out[1].advantage != 0
    assert metrics["loss/policy"] == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    assert metrics["async/is_weight_mean"] == pytest.approx(sum(w for w, _ in weights) / len(weights), rel=1e-5)
    assert metrics["async/is_weight_max"] == pytest.approx(max(raw for _, raw in weights), rel=1e-5)
    assert metrics["async/is_clipped_frac"] == pytest.approx(3 / 5)  # the -9.0 trajectory's three tokens
    # The same data trained synchronously (max_staleness 0, current) has no weight: -sum(A_b) / tokens.
    sync, out0 = _is_case(tmp_path / "k0", max_staleness=0)
    plain = [-t.advantage for t in out0 for s in t.segments if s.role == "model" for _ in s.token_ids]
    assert sync["loss/policy"] == pytest.approx(sum(plain) / len(plain), rel=1e-5)
    assert sync["loss/policy"] != pytest.approx(metrics["loss/policy"], rel=1e-3)
    assert "async/is_weight_mean" not in sync and "async/dropped_stale" not in sync


async def _steps(cfg, steps, pipeline_k):
    from rlfactory.train.session import open_rollout
    from rlfactory.train.run import load_env_data

    async with open_rollout(cfg, reward_mode="required") as session:
        trainer = Trainer(cfg, session, session.reward, load_env_data(session.env, "train"))
        assert pipeline_k in (None, cfg.trainer.max_staleness)
        pipeline = trainer.pipelined()[1] if pipeline_k is not None else None
        history = []
        for s in range(1, steps + 1):
            metrics, _ = await (pipeline.step(s) if pipeline is not None else trainer.step(s))
            history.append({k: v for k, v in metrics.items() if not k.startswith(TIMING)})
        if pipeline is not None:
            await pipeline.close()
        return history, [p.detach().clone() for p in trainer.learner.policy.parameters()]


def test_staleness_zero_equals_the_synchronous_trainer_exactly(tmp_path):
    cfg = load_config(RunConfig, run_config(tmp_path, trainer={"steps": 2}))
    torch.set_num_threads(torch.get_num_threads())
    sync_metrics, sync_weights = asyncio.run(_steps(cfg, 2, pipeline_k=None))
    pipe_metrics, pipe_weights = asyncio.run(_steps(cfg, 2, pipeline_k=0))
    assert pipe_metrics == sync_metrics
    assert all(torch.equal(a, b) for a, b in zip(sync_weights, pipe_weights))
    assert not any(k.startswith("async/") for k in sync_metrics[0])



@pytest.mark.parametrize("k, steps, first", [(1, 5, [1, 2]), (2, 5, [1, 2, 3]), (2, 2, [1, 2])])
def test_an_empty_pipeline_starts_every_rollout_the_first_version_allows(tmp_path, k, steps, first):
    """Step s may be rolled out once the learner holds version s-1-k, so with version 0 the
    rollouts of steps 1..k+1 start at once (the later ones' generation runs while the first one
    waits for its tools, not beside the first update); step s's update then starts step s+k+1's."""
    class Synced:
        async def ensure(self, policy, version):
            return {}

    started, gates = [], {}

    async def roll_out(step, sync_weights=True):
        assert not sync_weights
        started.append(step)
        gates[step] = asyncio.Event()
        await gates[step].wait()
        return f"rollout {step}"

    async def learn(step, rollout, executor=None):
        assert rollout == f"rollout {step}"
        return {}, []

    pipe = AsyncPipeline(roll_out, learn, steps, k, OffPolicyGeneration(None, Synced(), learner_threads=1),
                         policy=torch.nn.Linear(1, 1), version=lambda: 0)

    async def run():
        first_step = asyncio.ensure_future(pipe.step(1))
        for _ in range(20):
            await asyncio.sleep(0)
        assert sorted(started) == first and not first_step.done()  # step 1 still waits for its rollout
        gates[1].set()
        await first_step
        later = asyncio.ensure_future(pipe.step(2))
        for _ in range(20):
            await asyncio.sleep(0)
        assert sorted(started) == list(range(1, min(2 + k, steps) + 1))  # step 1's update started step k+2's
        gates[2].set()
        await later
        await pipe.close()

    asyncio.run(run())

def test_max_staleness_one_trains_and_resumes_from_a_checkpoint(tmp_path, capsys):
    cfg_path = run_config(tmp_path, trainer={"steps": 3, "max_staleness": 1, "save_every": 1},
                          rollout={"mode": "async"})
    assert main(["train", cfg_path]) == 0
    run = tmp_path / "run"
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["policy_version"] == 3
    for r in records:
        assert r["async/dropped_stale"] == 0 and r["async/staleness_max"] <= 1 and "async/is_weight_mean" in r
    assert any(r["optim/grad_norm"] > 0 for r in records)
    assert records[0]["async/staleness_max"] == 0  # step 1 rolled out before any update
    want = split_threads(None, None)  # the defaults: the generator gets half the cores while the learner trains
    assert all((r["async/learner_threads"], r["async/generator_threads"], r["async/learner_threads_shared"]) ==
               (want.learner, want.generator, want.learner_shared) for r in records)
    assert all("async/learner_thread_switches" in r for r in records)

    def versions(step):
        lines = (run / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()
        return {s["policy_version"] for line in lines for s in json.loads(line)["segments"] if s["role"] == "model"}

    # step 2 was rolled out while step 1 trained: its turns are version 0 or 1, never older
    assert versions(2) <= {0, 1}
    before = {n: p.clone() for n, p in _checkpoint_weights(run, 3).items()}

    # Resume to step 5: the rollouts in flight when the run stopped were not checkpointed; step 4
    # is rolled out again from the restored weights (version 3) before any further update.
    capsys.readouterr()
    assert main(["train", cfg_path, "trainer.steps=5", "--resume"]) == 0
    assert "trained 2 step(s)" in capsys.readouterr().out
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5] and records[-1]["policy_version"] == 5
    assert versions(4) == {3} and versions(5) <= {3, 4}
    after = _checkpoint_weights(run, 5)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def _checkpoint_weights(run, step):
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors"))


def test_the_readme_async_command_trains_on_the_search_env(tmp_path):
    """The Asynchronous training section's command, on a tiny budget."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    section = (root / "README.md").read_text().split("## Asynchronous training", 1)[1].split("\n## ", 1)[0]
    (line,) = re.findall(r"^    \.venv/bin/rlfactory (train .+)$", section, re.M)
    args = shlex.split(line)
    args[1] = str(root / args[1])
    small = ["sampling.seed=0", "rollout.max_new_tokens=16", "rollout.max_total_tokens=700",
             "env.options.n_train_entities=20", "env.options.n_test_entities=6", "trainer.prompts_per_step=2",
             "algo.group_size=2", "trainer.eval_every=0", "trainer.progress=false", "trainer.steps=2",
             f"trainer.run_dir={tmp_path / 'run'}"]
    assert "trainer.max_staleness=1" in args
    assert main([*args, *small]) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2] and all("async/staleness_max" in r for r in records)


def test_max_staleness_with_the_ray_backend_is_a_config_error(tmp_path):
    from rlfactory.config import ConfigError

    path = run_config(tmp_path, trainer={"max_staleness": 1, "backend": "ray"})
    with pytest.raises(ConfigError, match="max_staleness"):
        load_config(RunConfig, path)


def test_the_cores_are_split_while_both_compute():
    from rlfactory.train.async_pipeline import CoreSplit

    assert split_threads(None, None, available=2) == CoreSplit(learner=2, learner_shared=1, generator=1)
    assert split_threads(None, None, available=16) == CoreSplit(learner=16, learner_shared=8, generator=8)
    assert split_threads(3, None, available=4) == CoreSplit(learner=3, learner_shared=2, generator=2)
    assert split_threads(None, 2, available=2) == CoreSplit(learner=2, learner_shared=1, generator=2)
    assert split_threads(1, 1, available=1) == CoreSplit(learner=1, learner_shared=1, generator=1)


class _Generator:
    busy = False


def test_the_learner_switches_its_threads_per_layer_as_the_generator_comes_and_goes():
    """SharedCores: each decoder layer's forward and backward runs on `shared` threads while the
    generator is busy and `alone` while it is idle; without the hooks nothing changes."""
    import threading

    from rlfactory.train.async_pipeline import SharedCores

    model = tiny_qwen3()
    model.train()
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    assert len(layers) >= 2
    seen: dict[str, list[int]] = {"forward": [], "backward": []}

    def on_forward(module, args, output):
        seen["forward"].append(torch.get_num_threads())
        out = output[0] if isinstance(output, tuple) else output
        out.register_hook(lambda g: seen["backward"].append(torch.get_num_threads()))  # after SharedCores' own

    gen = _Generator()
    shared = SharedCores(model, gen, alone=2, shared=1)
    for layer in layers:
        layer.register_forward_hook(on_forward)

    def step(busy_forward: bool, busy_backward: bool) -> None:
        torch.set_num_threads(2)
        gen.busy = busy_forward
        loss = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.sum()
        gen.busy = busy_backward
        loss.backward()

    def run(*args):  # in a thread of its own, as the learner: torch's thread count is per thread
        t = threading.Thread(target=step, args=args)
        t.start()
        t.join()

    run(False, True)
    assert seen["forward"] == [2] * len(layers) and seen["backward"] == [1] * len(layers)
    seen["forward"].clear(), seen["backward"].clear()
    run(True, False)
    assert seen["forward"] == [1] * len(layers) and seen["backward"] == [2] * len(layers)
    assert shared.switches == 3  # to 1 for the first backward; to 1 and back to 2 in the second step
    assert shared.take_switches() == 3 and shared.switches == 0
    shared.close()
    seen["forward"].clear(), seen["backward"].clear()
    run(True, True)  # hooks removed: the thread's own count throughout
    assert seen["forward"] == [2] * len(layers) and seen["backward"] == [2] * len(layers)


def test_the_local_generator_is_busy_while_it_has_requests():
    from rlfactory.protocols import GenRequest
    from rlfactory.generation.local import LocalGenerator

    gen = LocalGenerator(tiny_qwen3(), pad_id=0)
    states = []

    async def go():
        task = asyncio.ensure_future(gen.submit(GenRequest([1, 2, 3], max_new_tokens=3)))
        await asyncio.sleep(0)  # submit has queued the request and started the worker
        states.append(gen.busy)
        await task
        await asyncio.sleep(0)  # the worker returns once the queue drains
        states.append(gen.busy)

    assert not gen.busy
    asyncio.run(go())
    gen.close()
    assert states == [True, False]


def test_the_learner_thread_has_its_own_thread_count_and_a_lower_priority():
    import os
    import sys
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from rlfactory.train.async_pipeline import LEARNER_NICE, learner_thread

    def probe():
        return torch.get_num_threads(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    mine = probe()
    with ThreadPoolExecutor(1, initializer=learner_thread, initargs=(1,)) as pool:
        threads, nice = pool.submit(probe).result()
    assert threads == 1 and probe() == mine  # this thread kept its own
    if sys.platform.startswith("linux"):
        assert nice == min(mine[1] + LEARNER_NICE, 19)


def test_the_generators_thread_runs_with_its_own_thread_count():
    """torch's thread count is per thread (OpenMP): the generator sets its own in its thread and the
    calling thread keeps its count."""
    from rlfactory.protocols import GenRequest
    from rlfactory.generation.local import LocalGenerator

    seen = []

    def record(requests, generated, logits):
        seen.append(torch.get_num_threads())
        return logits

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = LocalGenerator(tiny_qwen3(), pad_id=0, logits_processor=record)
        gen.threads = 1
        asyncio.run(gen.generate([GenRequest([1, 2, 3], max_new_tokens=3)]))
        gen.close()
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_thread_counts_below_one_are_config_errors(tmp_path):
    from rlfactory.config import ConfigError

    with pytest.raises(ConfigError, match="learner_threads"):
        load_config(RunConfig, run_config(tmp_path, trainer={"learner_threads": 0}))


@pytest.mark.parametrize("k", [0, 1])
def test_synchronous_steps_free_the_generators_cache_before_training_and_async_ones_do_not(tmp_path, k):
    trainer = _trainer(tmp_path, [], max_staleness=k)
    freed = []
    trainer.session.generator.free_cache = lambda: freed.append(True)
    trainer.steps.release_generation_memory()
    assert freed == ([True] if k == 0 else [])


@pytest.mark.parametrize("k", [0, 1])
def test_the_update_releases_its_threads_openmp_pool(k):
    """Whichever thread trains (the event loop's when synchronous, the learner's otherwise), its
    OpenMP pool is gone once the update is done (rlfactory/openmp.py). In a fresh process
    (tests/openmp_probe.py), where nothing else starts native threads while it counts them."""
    import subprocess
    import sys
    from pathlib import Path

    from rlfactory.openmp import available

    if not available():
        pytest.skip("torch does not run on libgomp >= 5.0 here")
    probe = Path(__file__).resolve().parents[1] / "openmp_probe.py"
    out = subprocess.run([sys.executable, str(probe), f"update{k}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["version"] == 1 and r["kept"] == 4
    assert r["after"] == r["base"]
