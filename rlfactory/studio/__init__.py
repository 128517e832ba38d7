"""rlfactory studio: the web UI served by `rlfactory ui`.

It reads run directories (config.yaml, metrics.jsonl, eval.jsonl, trajectories/step_NNNNNN.jsonl,
checkpoints/) and launches the ordinary `rlfactory train | sft | eval` commands as subprocesses;
nothing in `train` or `rollout` imports it. Pages: Runs, Live metrics, Trajectory viewer, New run,
Tools, Rewards, Data, Playground (static/js/*.js, no build step, no CDN).

Safety: the server binds 127.0.0.1 by default and every request carries the token printed at
start-up (auth.py); run paths are resolved inside the runs directory (paths.py); a launch is a
validated config and one of rlfactory's own commands (jobs.py); uploads have a size limit.

The app is `rlfactory.studio.app.create_app`.
"""
