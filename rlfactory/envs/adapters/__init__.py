"""Adapters that make environments of other libraries rlfactory envs (`env.name: verifiers`,
`env.name: openenv`). Each imports its library only when built."""
