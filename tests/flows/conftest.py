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
