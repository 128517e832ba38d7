"""Typed configuration, at the bottom of the house: every config section, `RunConfig`, and the
machinery that reads one YAML file into them (`load_config`, dotted overrides, errors that name
the key and the file, did-you-mean suggestions).

Every layer imports its section from here (`from rlfactory.config import RolloutConfig`), so no
layer needs to import the one above it to know what its settings are. The sections import nothing
else of rlfactory; `algo.advantage` and `algo.loss` are looked up in `rlfactory.algos` when a
config is validated. The sections are imported on first use, so a process that only needs
`ConfigError` (an MCP server, a sandboxed program) does not build every pydantic model.

    base.py       Section, load_config / validate / apply_overrides, ExistingFile, ConfigPath, did_you_mean
    rollout.py    model:, sampling:, rollout:
    generator.py  generator:
    tools.py      tools: (and tools.per_tool)
    env.py        env:
    reward.py     reward: (and its judge and verify parts)
    tracker.py    trainer.tracker:
    kernels.py    trainer.kernels:
    sft.py, fsdp.py, ray.py   sft:, fsdp:, ray:
    run.py        algo:, trainer:, and RunConfig, the whole file
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfactory.config.base import (
    ConfigError,
    ConfigPath,
    ExistingFile,
    Section,
    apply_overrides,
    closest,
    config_problems,
    did_you_mean,
    dump_config,
    format_validation_error,
    load_config,
    read_yaml,
    validate,
)
from rlfactory.lazy import lazy_exports

if TYPE_CHECKING:
    from rlfactory.config.env import EnvConfig
    from rlfactory.config.fsdp import FsdpConfig
    from rlfactory.config.generator import GeneratorConfig
    from rlfactory.config.kernels import KernelsConfig
    from rlfactory.config.ray import RayConfig
    from rlfactory.config.reward import JudgeConfig, RewardConfig, VerifyConfig
    from rlfactory.config.rollout import TOOL_FAILURE_STATUSES, ModelConfig, RolloutConfig, SamplingConfig
    from rlfactory.config.run import AlgoConfig, LoraSection, RunConfig, TrainerConfig
    from rlfactory.config.sft import SftConfig
    from rlfactory.config.tools import ToolOptions, ToolsConfig
    from rlfactory.config.tracker import TRACKERS, LoggerName, TrackerConfig

_SECTIONS = {
    "EnvConfig": "env",
    "FsdpConfig": "fsdp",
    "GeneratorConfig": "generator",
    "KernelsConfig": "kernels",
    "RayConfig": "ray",
    "JudgeConfig": "reward",
    "RewardConfig": "reward",
    "VerifyConfig": "reward",
    "TOOL_FAILURE_STATUSES": "rollout",
    "ModelConfig": "rollout",
    "RolloutConfig": "rollout",
    "SamplingConfig": "rollout",
    "AlgoConfig": "run",
    "LoraSection": "run",
    "RunConfig": "run",
    "TrainerConfig": "run",
    "SftConfig": "sft",
    "ToolOptions": "tools",
    "ToolsConfig": "tools",
    "TRACKERS": "tracker",
    "LoggerName": "tracker",
    "TrackerConfig": "tracker",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SECTIONS, globals(), eager=[
    "ConfigError", "ConfigPath", "ExistingFile", "Section", "apply_overrides", "closest", "config_problems",
    "did_you_mean", "dump_config", "format_validation_error", "load_config", "read_yaml", "validate",
])
