"""A Prefect test server for the whole session (prefect_test_harness), with analytics off."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session", autouse=True)
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def small_federation(work, n_customers: int, seed: int, params: dict):
    """The demo federation in `work`, with fewer customers and a small forest so flows run fast:
    returns (config path, scenario)."""
    import yaml

    from flows.demo import prepare_workspace

    config_path, scenario = prepare_workspace(work, n_customers=n_customers, seed=seed)
    raw = yaml.safe_load(config_path.read_text())
    raw["params"] = {**params, "random_state": 0}
    raw["training"]["connect_timeout_s"] = 90
    config_path.write_text(yaml.safe_dump(raw))
    return config_path, scenario
