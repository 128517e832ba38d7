"""Adapters that run rlfactory's envs, tools and rollout loop inside other training frameworks.

`rlfactory.integrations.verl`: an agent loop for verl. Nothing in rlfactory's own training or
rollout code imports this package.
"""
