"""rlfactory's agent loop inside verl's real AgentLoopWorker; run by test_integrations_verl_real.py
with a Python that has verl installed.

    python verl_check.py --agent-loops AGENT_LOOPS.yaml --rlfactory-config CFG.yaml --out OUT.json

What is verl's own here: the trainer config (verl's generated ppo_trainer.yaml), RLHFDataset and
collate_fn reading the parquet that `python -m rlfactory.integrations.verl.dataset` writes, the
`DataProto` batch repeated n times as verl's trainer does, `AgentLoopWorker` (it loads the
agent-loop YAML, instantiates the agent loop per sample with hydra, pads and stacks the outputs)
and `TokenOutput`. What stands in: the LLM server manager (verl_fakes.TinyVerlServer: the tiny
model behind verl's `generate` signature; verl's servers need vLLM or SGLang on a GPU). Two
batches go through one worker; OUT.json gets, per sample, the unpadded prompt, response, mask,
rollout logprobs and non-tensor fields, plus every turn the server served; with --command, the
overrides of that script's `verl.trainer.main_ppo` command that verl's trainer config lacks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PROMPT_LENGTH, RESPONSE_LENGTH, N = 1024, 384, 2


def verl_config(agent_loops: str, model_path: str):
    import verl
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    cfg.actor_rollout_ref.model.path = model_path
    rollout = cfg.actor_rollout_ref.rollout
    rollout.name = "vllm"
    rollout.prompt_length, rollout.response_length = PROMPT_LENGTH, RESPONSE_LENGTH
    rollout.calculate_log_probs = True
    rollout.n = N
    rollout.agent.agent_loop_config_path = agent_loops
    cfg.data.max_prompt_length = PROMPT_LENGTH
    return cfg


def command_keys(script: str) -> list[str]:
    """The `key=value` overrides of the `verl.trainer.main_ppo` command in a shell script."""
    text = Path(script).read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "verl.trainer.main_ppo" in line)
    tokens = shlex.split(line.split("verl.trainer.main_ppo", 1)[1])
    return [t.split("=", 1)[0] for t in tokens if "=" in t]


def unknown_keys(keys: list[str], cfg) -> list[str]:
    """The dotted keys that verl's trainer config does not have."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=False)
    missing = []
    for key in keys:
        node = tree
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(key)
                break
            node = node[part]
    return missing


def unpad(out, i: int) -> dict:
    import numpy as np

    prompts, responses = out.batch["prompts"][i], out.batch["responses"][i]
    attention = out.batch["attention_mask"][i]
    p = prompts.shape[0]
    prompt_valid, response_valid = attention[:p].bool(), attention[p:].bool()
    row = {
        "prompt_ids": prompts[prompt_valid].tolist(),
        "response_ids": responses[response_valid].tolist(),
        "response_mask": out.batch["response_mask"][i][response_valid].tolist(),
        "padded_mask_tail": out.batch["response_mask"][i][~response_valid].tolist(),
        "rollout_log_probs": out.batch["rollout_log_probs"][i][response_valid].tolist(),
        "input_ids": out.batch["input_ids"][i][attention.bool()].tolist(),
    }
    for key, column in out.non_tensor_batch.items():
        value = column[i]
        if isinstance(value, np.generic):
            value = value.item()
        if key.startswith("rlfactory_") or key in ("__num_turns__", "agent_name", "uid", "index"):
            row[key] = value
    return row


async def run(args) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.workers.rollout.replica import TokenOutput
    from verl_fakes import TinyVerlServer

    from rlfactory.integrations.verl.dataset import main as make_dataset
    from rlfactory.integrations.verl.worker import close_workers, started_workers
    from rlfactory.tiny import resolve_model

    torch.set_num_threads(1)
    parquet = str(Path(args.out).with_suffix(".parquet"))
    assert make_dataset([args.rlfactory_config, "--split", "train", "--out", parquet]) == 0
    model_path = resolve_model("tiny:1m")
    server = TinyVerlServer(AutoModelForCausalLM.from_pretrained(model_path).eval(),
                            AutoTokenizer.from_pretrained(model_path), token_output=TokenOutput)
    cfg = verl_config(args.agent_loops, model_path)
    cfg.data.cache_dir = str(Path(args.out).parent / "verl_cache")
    keys = command_keys(args.command) if args.command else []
    worker = AgentLoopWorker(cfg, server)
    dataset = RLHFDataset(parquet, worker.tokenizer, cfg.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([f"u{i}" for i in range(len(batch))], dtype=object)
    samples = []
    try:
        for step in range(2):
            gen_batch = batch.repeat(repeat_times=N, interleave=True)
            gen_batch.meta_info["global_steps"] = step + 1
            out = await worker.generate_sequences(gen_batch)
            samples += [dict(unpad(out, i), step=step) for i in range(len(out))]
        workers = [{"trajectories": w.trajectories, "infra_errors": w.infra_errors} for w in started_workers()]
        metrics = out.meta_info.get("metrics")
    finally:
        await close_workers()
        server.close()
    turns = [{"request_id": c.request_id, "prompt_ids": c.prompt_ids, "token_ids": c.token_ids,
              "log_probs": c.log_probs, "sampling_params": c.sampling_params} for c in server.calls]
    return {"samples": samples, "turns": turns, "workers": workers, "metrics": metrics,
            "response_length": RESPONSE_LENGTH, "prompt_length": PROMPT_LENGTH,
            "command_keys": keys, "unknown_command_keys": unknown_keys(keys, cfg)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agent-loops", required=True)
    p.add_argument("--rlfactory-config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--command", help="a shell script whose verl.trainer.main_ppo overrides are checked")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
