"""A local Ray cluster for the distributed tests: one per test session, on this machine's cores,
with its own temp dir, no auth and no usage stats; shut down at the end."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    ray = pytest.importorskip("ray")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    temp = tmp_path_factory.mktemp("ray")
    ray.init(num_cpus=os.cpu_count() or 2, _temp_dir=str(temp), include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
