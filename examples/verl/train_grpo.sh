#!/usr/bin/env bash
# GRPO in verl with rlfactory's agent loop: the calculator MCP server as the tool, rlfactory's
# qwen3 ToolManager as the parser, verl's vLLM server as the generator (README: "Inside verl").
#   bash examples/verl/train_grpo.sh [MODEL] [more verl overrides...]
# Run from the rlfactory checkout, with verl (and vLLM) installed beside rlfactory, on 1 GPU.
# Not run in rlfactory's CI (no GPU); tests/integrations/test_integrations_verl_real.py checks every
# key below against verl's trainer config and runs the same agent loop inside verl's AgentLoopWorker.
set -euo pipefail
MODEL=${1:-Qwen/Qwen3-0.6B}
shift $(( $# > 0 ? 1 : 0 ))
DATA=data/verl_calculator
python -m rlfactory.integrations.verl.dataset examples/verl/calculator.yaml --split train --out $DATA/train.parquet
python -m rlfactory.integrations.verl.dataset examples/verl/calculator.yaml --split test --out $DATA/test.parquet
python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$DATA/train.parquet \
    data.val_files=$DATA/test.parquet \
    data.train_batch_size=4 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loop.yaml \
    actor_rollout_ref.rollout.agent.default_agent_loop=rlfactory \
    actor_rollout_ref.rollout.agent.num_workers=2 \
    reward.custom_reward_function.path=examples/verl/calculator_reward.py \
    reward.custom_reward_function.name=compute_score \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.total_epochs=1 \
    trainer.val_before_train=false \
    trainer.logger=console \
    "$@"
