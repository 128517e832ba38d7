"""Build a ready rollout engine from a RunConfig: `async with open_rollout(cfg) as session: ...`.

Builds the env, starts the ToolRunner (the `tools:` section plus the env's own tools) and builds
the reward, all checked before anything heavy loads (see rlfactory/train/prepare.py); then
loads the model and tokenizer (rlfactory/generation/model_source.py: HF folders, .gguf files,
`tiny:1m`, `smollm2:135m`) on `model.device` in `model.dtype`, picks the ToolManager family,
checks its token contract against the tokenizer and wraps the model in a LocalGenerator, or,
with `generator.backend: server`, connects a ServerGenerator to the configured servers.
Everything started is stopped when the block exits.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Literal, Sequence

from rlfactory.config import GeneratorConfig, ModelConfig, RunConfig
from rlfactory.chat.vision import PixelSource
from rlfactory.protocols import Generator
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.model_source import check_model_path, load_model, pick_device, resolve_model_path

log = logging.getLogger("rlfactory.train")

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from rlfactory.chat.base import ToolManager
    from rlfactory.envs.base import Env
    from rlfactory.rewards.base import Reward
    from rlfactory.generation.server_generator import ServerGenerator
    from rlfactory.tools.runner import ToolRunner


@dataclass
class RolloutSession:
    engine: RolloutEngine
    generator: Generator
    """A LocalGenerator, or a ServerGenerator with generator.backend: server."""
    model: nn.Module | None
    """The policy model (the learner's copy with the server backend; None when not loaded)."""
    tokenizer: PreTrainedTokenizerBase
    tool_manager: ToolManager
    runner: ToolRunner
    env: Env
    reward: Reward | None = None
    """The run's reward (None: none configured, or not asked for)."""


def tool_manager_for(model_cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase,
                     model: nn.Module | None = None, model_type: str | None = None) -> ToolManager:
    """The ToolManager that `model_cfg` asks for (family guessed from the chat template if unset),
    with the template family's options (`call_format`, `chat_template_kwargs`)."""
    from rlfactory.chat import guess_family, make_tool_manager

    model_type = model_type or getattr(getattr(model, "config", None), "model_type", None)
    family = model_cfg.family or guess_family(tokenizer, model_type)
    opts: dict[str, Any] = {}
    if family == "template":
        opts = {"call_format": model_cfg.call_format, "template_kwargs": dict(model_cfg.chat_template_kwargs),
                "model_name": model_cfg.path}
    elif model_cfg.call_format != "auto":
        raise ValueError(f"model.call_format applies to the template family only (model.family is {family})")
    elif family == "qwen3" and set(model_cfg.chat_template_kwargs) <= {"enable_thinking"}:
        if model_cfg.chat_template_kwargs:
            opts = {"enable_thinking": model_cfg.chat_template_kwargs["enable_thinking"]}
    elif model_cfg.chat_template_kwargs:
        raise ValueError(f"model.chat_template_kwargs applies to the template family (and enable_thinking to "
                         f"qwen3); model.family is {family}")
    return make_tool_manager(tokenizer, family, model_type, **opts)


def checked_tool_manager(model_cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase,
                         model_type: str | None, rerenders: bool = False) -> ToolManager:
    """`tool_manager_for`, its token contract checked against the tokenizer. When a `model.family`
    set in the config breaks the contract and the family read from the chat template keeps it, a
    ConfigError says so in one line. `rerenders` (rollout.context: drop_thinking): the rollout
    renders each turn's prompt with the template and starts a new sample where it rewrites earlier
    turns, so a broken contract (e.g. Qwen3's template dropping think blocks) is logged, not raised."""
    from rlfactory.chat import TokenContractError, check_token_contract, guess_family
    from rlfactory.config import ConfigError

    tool_manager = tool_manager_for(model_cfg, tokenizer, model_type=model_type)
    try:
        check_token_contract(tool_manager, tokenizer, model_name=model_cfg.path)
    except TokenContractError as e:
        if rerenders:
            log.info("the chat template rewrites earlier turns (%s); rollout.context=drop_thinking starts a new "
                     "sample of the episode where it does", str(e).strip().splitlines()[0][:300])
            return tool_manager
        if model_cfg.family is None:
            raise
        try:
            guessed = guess_family(tokenizer, model_type)
            if guessed == model_cfg.family:
                raise e
            check_token_contract(tool_manager_for(model_cfg.model_copy(update={"family": None}), tokenizer,
                                                  model_type=model_type), tokenizer, model_name=model_cfg.path)
        except (TokenContractError, ValueError):
            raise e from None
        first = str(e).strip().splitlines()[0]
        raise ConfigError(f"model.family: {model_cfg.family!r} does not fit the chat template of {model_cfg.path} "
                          f"({first}); its template reads as family {guessed!r}, which does: set "
                          f"model.family: {guessed}, or leave model.family unset") from e
    return tool_manager


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of `cfg.path` alone (a rollout on generation servers needs no weights here)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(cfg.path))


def _model_type(cfg: ModelConfig, model: nn.Module | None) -> str | None:
    if model is not None:
        return getattr(getattr(model, "config", None), "model_type", None)
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(resolve_model_path(cfg.path)), "model_type", None)


def open_server_generator(gen_cfg: GeneratorConfig, tokenizer: PreTrainedTokenizerBase, tool_manager: ToolManager,
                          seed: int | None) -> ServerGenerator:
    """A ServerGenerator for the `generator:` section, stopping where the tool manager says."""
    from rlfactory.generation.server_generator import ServerGenerator

    return ServerGenerator(gen_cfg.urls, gen_cfg.api, tokenizer, tool_manager.stop_token_ids(), tool_manager.stop_strings(),
                           timeout_s=gen_cfg.timeout_s, cooldown_s=gen_cfg.cooldown_s,
                           served_model=gen_cfg.served_model, seed=seed)


def pad_id_of(tokenizer: PreTrainedTokenizerBase, model: nn.Module | None = None) -> int:
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            return int(value)
    cfg = getattr(model, "config", None)
    return int(getattr(cfg, "pad_token_id", None) or getattr(cfg, "eos_token_id", None) or 0)


@contextlib.asynccontextmanager
async def open_rollout(
    cfg: RunConfig,
    *,
    model: nn.Module | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    env: Env | None = None,
    logits_processor: Any = None,
    load_policy: bool = True,
    reward_mode: Literal["optional", "required", "off"] = "optional",
    check_splits: Sequence[str] = (),
    connect_server: Any = None,
) -> AsyncIterator[RolloutSession]:
    """A RolloutSession for `cfg` (a rlfactory.config.RunConfig).

    The env, the tools (MCP servers started) and the reward are built and checked before the
    model loads (rlfactory/train/prepare.py), so a config mistake costs seconds and one line.
    `session.reward` is the run's reward: the `reward:` section over the env's own; None when
    neither gives one (a ConfigError with `reward_mode="required"`) or with `reward_mode="off"`.
    The rows of `check_splits` are checked against what the reward reads, also before the model
    loads (a split the env does not have is skipped).
    Pass `model`/`tokenizer` to roll out a model you already hold (the trainer's policy: the
    generator reads it in place, so weight updates apply to the next rollout), `env` to reuse one.
    With `generator.backend: server` turns are generated by servers (server_generator.py) and
    `model` is the learner's copy; `load_policy=False` skips loading it (rollouts only).
    `connect_server` reaches the MCP servers (see ToolRunner; default: start them in this process).
    """
    from rlfactory.envs.base import require_members
    from rlfactory.train.prepare import CommandChecks, build_env, prepare_tools_and_reward, resolve_max_turns

    gen_cfg = cfg.generator
    on_servers = gen_cfg.backend == "server"
    if on_servers and logits_processor is not None:
        raise ValueError("a logits_processor needs generator.backend: local")
    own_env = env is None
    if model is None or tokenizer is None:
        check_model_path(cfg.model.path)  # before anything starts: one line, no download
    if env is None:
        env = build_env(cfg)  # make_env checks its members
    else:
        require_members(env)
        resolve_max_turns(cfg, env)
    generator = runner = None
    try:
        runner, reward = await prepare_tools_and_reward(cfg, env, CommandChecks(reward_mode, tuple(check_splits)),
                                                        connect_server)
        if model is None and (load_policy or not on_servers):
            model, loaded_tok = load_model(cfg.model, pick_device(cfg.model.device))
            tokenizer = tokenizer if tokenizer is not None else loaded_tok
        elif tokenizer is None:
            tokenizer = load_tokenizer(cfg.model)
        tool_manager = checked_tool_manager(cfg.model, tokenizer, _model_type(cfg.model, model),
                                            rerenders=cfg.rollout.context == "drop_thinking")
        if on_servers:
            generator = open_server_generator(gen_cfg, tokenizer, tool_manager, cfg.sampling.seed)
        else:
            generator = LocalGenerator(
                model,
                pad_id_of(tokenizer, model),
                tool_manager.stop_token_ids(),
                tokenizer=tokenizer,
                stop_strings=tool_manager.stop_strings(),
                device=next(model.parameters()).device,
                max_batch=cfg.rollout.max_batch,
                admission_wait=cfg.rollout.admission_wait,
                seed=cfg.sampling.seed,
                logits_processor=logits_processor,
                cuda_graphs=cfg.rollout.cuda_graphs,
                pixels=tool_manager if isinstance(tool_manager, PixelSource) else None,  # VL: images in prefill
            )
        engine = RolloutEngine(generator, tool_manager, runner, env, cfg.rollout, cfg.sampling, tokenizer=tokenizer)
        yield RolloutSession(engine, generator, model, tokenizer, tool_manager, runner, env, reward)
    finally:
        if generator is not None:
            if on_servers:
                await generator.aclose()
            else:
                generator.close()
        if runner is not None:
            await runner.aclose()
        if own_env:
            env.close()
