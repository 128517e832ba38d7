"""rlfactory inside verl: an agent loop (agent_loop.py, needs verl) over rlfactory's rollout engine.

    config.py      the rlfactory side of the agent loop: family, env, tools, per-turn limits
    generator.py   VerlGenerator: rlfactory's Generator over verl's `server_manager.generate`
    worker.py      the env, ToolManager and started ToolRunner kept per verl worker
    rollout.py     rollout_row: one verl row -> one rlfactory trajectory -> AgentLoopOutput fields
    output.py      a Trajectory as AgentLoopOutput fields (prompt/response ids, mask, logprobs)
    agent_loop.py  RLFactoryAgentLoop, verl's AgentLoopBase (imports verl)
    dataset.py     an env's rows as a verl parquet dataset (`python -m rlfactory.integrations.verl.dataset`)

Only agent_loop.py imports verl, so the rest works (and is tested) without it.
"""
