"""Config sections `algo:` and `trainer:`, and `RunConfig`, the whole run file:
`rlfactory.config.load_config(RunConfig, path, overrides)`.

The docstring under each field is the config reference.
"""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import ValidationInfo, field_validator, model_validator

from rlfactory.config.base import ConfigPath, Section, require_at_least_one
from rlfactory.config.env import EnvConfig
from rlfactory.config.fsdp import FsdpConfig
from rlfactory.config.generator import GeneratorConfig
from rlfactory.config.kernels import KernelsConfig
from rlfactory.config.ray import RayConfig
from rlfactory.config.reward import RewardConfig
from rlfactory.config.rollout import ModelConfig, RolloutConfig, SamplingConfig
from rlfactory.config.sft import SftConfig
from rlfactory.config.tools import ToolsConfig
from rlfactory.config.tracker import LoggerName, TrackerConfig


class AlgoConfig(Section):
    """What the policy update computes: advantages, the policy loss and its regularisers."""

    advantage: str = "grpo"
    """Advantage estimator. grpo: (r - group mean) / group std; dr_grpo: r - group mean (no std,
    Dr. GRPO); rloo: leave-one-out baseline; reinforce++: batch-normalised r - group mean;
    gae: per-token GAE with a learned critic (PPO); per turn, from the turns' own rewards
    (reward.turn_terms, env step rewards) and no critic: turn_grpo (turn-discounted returns, GRPO
    baseline), gigpo (GiGPO), turn_loo (a length-unbiased per-turn baseline). Or your own: a name registered with
    `@rlfactory.algos.register_advantage`, or `module:function` (the module is imported from the
    config's folder or the path; `function` is a name it registers or a plain function
    `(rewards [B], groups [B], valid [B]) -> advantages [B]`)."""
    group_size: int = 8
    """Trajectories sampled per prompt (the group that grpo/rloo baselines are taken over)."""
    loss: str = "ppo"
    """Policy loss: ppo (token-level clipped ratio) or gspo (sequence-level clipped ratio). Or your
    own: a name registered with `@rlfactory.algos.register_policy_loss`, or `module:function`
    (as for `advantage`; the signature is in rlfactory/algos/losses.py)."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses are averaged: over all loss tokens of the minibatch (DAPO), per
    sequence then over sequences (GRPO paper), summed per sequence, or summed and divided by
    rollout.max_total_tokens per sequence (Dr. GRPO)."""
    clip_low: float = 0.2
    """PPO ratio clip below: the ratio is clipped to 1 - clip_low."""
    clip_high: float = 0.2
    """PPO ratio clip above: 1 + clip_high (DAPO's clip-higher uses 0.28). For gspo use ~4e-4."""
    kl_coef: float = 0.0
    """Weight of the KL penalty against a frozen reference model; 0 = no reference model at all."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman's k1/k2/k3) for the KL penalty."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    epochs: int = 1
    """Passes over each step's trajectories (PPO epochs)."""
    minibatch_size: int | None = None
    """Trajectories per optimizer step; unset = all trajectories of the step in one update."""
    micro_batch_size: int | None = None
    """Most trajectories per forward/backward pass inside a minibatch (gradient accumulation);
    unset = no cap (512 when grouped by length, rlfactory/passes.py PLAN_WINDOW). Does not change
    the result, only memory and speed."""
    micro_batch_tokens: int | None = None
    """Most token positions per forward/backward pass (padded completions plus the prompts they
    continue; with trainer.kernels.packed, real tokens only; a longer trajectory gets a pass of its
    own), as verl's ppo_max_token_len_per_gpu: bounds the update's activation memory; unset = no
    cap. Needs group_by_length."""
    group_by_length: bool = True
    """Split each minibatch into passes of trajectories of similar length where that saves padded
    positions (rlfactory/passes.py `plan_micro_batches`; a step's trajectories differ by whole
    tool responses); false = consecutive passes of micro_batch_size trajectories."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal (they carry no signal)."""
    gamma: float = 1.0
    """gae: discount per token."""
    lam: float = 1.0
    """gae: GAE lambda."""
    turn_gamma: float = 1.0
    """turn_grpo / gigpo / turn_loo: discount per model turn (each turn's return is its own reward
    plus turn_gamma times the next turn's return; GiGPO's paper uses 0.95). Not `gamma`, which
    is gae's per token."""
    turn_reward_weight: float = 1.0
    """turn_grpo / gigpo / turn_loo: weight of each turn's own reward (process rewards) against
    the outcome reward, which sits on the last turn; 0 = outcome only."""
    turn_step_weight: float = 1.0
    """gigpo: weight (omega) of the step-level advantage added to the episode-level one."""
    turn_norm_by_std: bool = True
    """turn_grpo / gigpo: divide by the group's standard deviation (GiGPO's mean_std_norm; false
    = mean_norm, which keeps the estimate unbiased where choices differ in the spread of their
    returns). turn_loo never divides."""
    value_coef: float = 0.5
    """gae: weight of the critic's value loss."""
    value_clip: float = 0.2
    """gae: clip range of the critic's value update."""
    tis_cap: float | None = 2.0
    """Asynchronous training (trainer.max_staleness >= 1): each token's policy loss is weighted by
    min(pi_old / pi_behaviour, tis_cap), where pi_behaviour is the sampler's logprob (the policy
    version that generated the token) and pi_old the trainer's recomputation before the update,
    against which the PPO ratio is taken (decoupled PPO / truncated importance sampling: verl's
    `tis_imp_ratio_cap`, AReaL's `behav_imp_weight_cap`). null = no weight (the ratio alone).
    Unused when max_staleness is 0."""

    @field_validator("advantage", "loss")
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        # The names are algos' registries'; imported here, not at the top, so that importing the
        # config package (every layer does) does not import torch.
        from rlfactory.algos import resolve_advantage, resolve_policy_loss

        if ":" in name:  # `module:function` may live next to the config
            base = (info.context or {}).get("base_dir")
            if base and base not in sys.path:
                sys.path.insert(0, base)
        return resolve_advantage(name) if info.field_name == "advantage" else resolve_policy_loss(name)

    @model_validator(mode="after")
    def _check(self) -> "AlgoConfig":
        require_at_least_one(self, "algo", "group_size", "epochs")
        if self.micro_batch_tokens is not None and not self.group_by_length:
            raise ValueError("algo.micro_batch_tokens needs algo.group_by_length: true")
        require_at_least_one(self, "algo", "minibatch_size", "micro_batch_size", "micro_batch_tokens")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError("algo.tis_cap must be > 0 (or null for no importance weight)")
        return self


class LoraSection(Section):
    """LoRA adapters through `peft`: only the adapters are trained and saved."""

    r: int = 8
    """Rank of the adapters."""
    alpha: int = 16
    """LoRA alpha (the update is scaled by alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """Names of the linear layers that get adapters."""


class TrainerConfig(Section):
    """The training loop: optimizer, schedule, run directory, checkpoints."""

    lr: float = 1e-5
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 0
    """Optimizer updates of linear warm-up from 0 to `lr`; constant afterwards."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm; 0 = no clipping (the norm is still logged)."""
    steps: int = 100
    """Training steps (one step = roll out, score, update, bump the policy version)."""
    prompts_per_step: int = 8
    """Dataset rows per step; each is rolled out `algo.group_size` times."""
    seed: int = 0
    """Every random choice of step s (prompts, sampling, minibatch order) derives from (seed, s)."""
    run_dir: ConfigPath = "runs/default"
    """Where config.yaml, metrics.jsonl, TensorBoard events, trajectories and checkpoints go."""
    save_every: int = 50
    """Write a checkpoint every this many steps (and after the last step); 0 = only at the end."""
    keep_last: int = 2
    """Checkpoints kept (older ones are deleted)."""
    bf16: bool = False
    """bfloat16 autocast for the training forward passes (CPU or GPU); weights stay float32."""
    lora: LoraSection | None = None
    """LoRA settings; unset = full fine-tuning."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, slower)."""
    kernels: KernelsConfig = KernelsConfig()
    """Kernels of the training forward (fused LM-head logprobs, Liger, torch.compile, packing)."""
    eval_every: int = 0
    """Evaluate on the env's test split every this many steps; 0 = never during training."""
    eval_limit: int | None = None
    """Evaluate on at most this many test rows (the first ones); unset = all."""
    log_trajectories: bool = True
    """Write every step's trajectories to run_dir/trajectories/step_NNNNNN.jsonl."""
    loggers: list[LoggerName] = ["jsonl", "tensorboard"]
    """Where metrics go: jsonl (run_dir/metrics.jsonl; always written, resume and the studio read
    it), tensorboard (run_dir/tensorboard), and the experiment trackers wandb, mlflow, trackio
    (each an extra: `pip install 'rlfactory[wandb]'`; set up in `trainer.tracker`)."""
    tracker: TrackerConfig = TrackerConfig()
    """Settings of the experiment trackers named in `loggers`."""
    progress: bool = True
    """Show a progress bar on stderr."""
    backend: Literal["local", "ray"] = "local"
    """local: roll out and learn in this process. ray: the learner stays in this process, rollout
    workers and MCP tool servers run as Ray actors (settings in the `ray:` section; needs
    `pip install 'rlfactory[ray]'`)."""
    max_staleness: int = 0
    """Asynchronous, off-policy training: how many policy versions a model segment may be behind
    the weights it is trained on. 0 = synchronous (each step rolls out with the current weights,
    then trains). k >= 1: the rollouts of steps s+1..s+k run while step s trains (with the local
    generator, on a copy of the policy that takes each new version between turns); a trajectory
    with a model segment more than k versions behind is dropped (`async/dropped_stale`), and the
    loss corrects for the sampling policy (algo.tis_cap). Rollouts in flight are not checkpointed:
    `--resume` regenerates them with the restored weights."""
    learner_threads: int | None = None
    """With max_staleness >= 1 and the local generator on the CPU, learning and generation run at
    the same time, in two threads of this process: torch CPU threads of the learner's while the
    generator is idle (unset = all of the process's); while it generates, the learner takes the
    threads the generator's leave, switching per decoder layer. The learner's thread runs at a
    lower priority (nice 10 on Linux)."""
    generator_threads: int | None = None
    """Torch CPU threads of the local generator's thread while the learner trains (unset = half of
    the process's, at least 1); all of them at other times."""

    @model_validator(mode="after")
    def _check(self) -> "TrainerConfig":
        if self.steps < 0 or self.prompts_per_step < 1:
            raise ValueError("trainer.steps must be >= 0 and trainer.prompts_per_step >= 1")
        require_at_least_one(self, "trainer", "keep_last")
        if self.max_staleness < 0:
            raise ValueError("trainer.max_staleness must be >= 0 (0 = synchronous training)")
        if any(n is not None and n < 1 for n in (self.learner_threads, self.generator_threads)):
            raise ValueError("trainer.learner_threads and trainer.generator_threads must be >= 1 (unset = the defaults)")
        if self.max_staleness > 0 and self.backend != "local":
            raise ValueError(f"trainer.max_staleness >= 1 is not supported with trainer.backend: {self.backend} yet "
                             "(asynchronous training runs with the local backend)")
        return self


class RunConfig(Section):
    model: ModelConfig = ModelConfig()
    tools: ToolsConfig = ToolsConfig()
    env: EnvConfig = EnvConfig()
    reward: RewardConfig = RewardConfig()
    sampling: SamplingConfig = SamplingConfig()
    rollout: RolloutConfig = RolloutConfig()
    generator: GeneratorConfig = GeneratorConfig()
    algo: AlgoConfig = AlgoConfig()
    trainer: TrainerConfig = TrainerConfig()
    ray: RayConfig = RayConfig()
    sft: SftConfig = SftConfig()
    fsdp: FsdpConfig = FsdpConfig()
