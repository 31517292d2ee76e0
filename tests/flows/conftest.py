"""What the flow tests share, made once per session.

A Prefect test server (prefect_test_harness) with analytics off, and two demo federations, one trained by
`retrain` and one ready to be crashed.

A shared federation is never changed: a test gets its own copy (`tests.federations.copy_of`), with the
agents on other ports, and changes that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.federations import Federation, copy_of, small_federation
from tests.flows.crashes import PARAMS as CRASH_PARAMS
from tests.flows.crashes import version_tables

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """The test server; the master flows' results (`flows.RETURNED_SUMMARY`) go to a temporary folder."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    results = tmp_path_factory.mktemp("prefect-results")
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: results}):
        with prefect_test_harness(server_startup_timeout=180):
            yield


@pytest.fixture(scope="module", autouse=True)
def _server_for_flow_runs(request) -> None:
    """The session's server, before any of a module's fixtures runs a flow.

    Every test here that runs a flow is marked slow; a module whose selected tests are all unmarked
    (command-line parsing) needs no server, so `make test` (not slow) does not start one.
    """
    if any(item.module is request.module and item.get_closest_marker("slow")
           for item in request.session.items):
        request.getfixturevalue("prefect_server")


@pytest.fixture(scope="session")
def trained_federation(tmp_path_factory, prefect_server) -> Federation:
    """The demo federation (1,200 customers; 8 trees of depth 5) after one `retrain` with local agents.

    Version v0001 is registered, promoted and predicted for the bank. Used through `copy_of`. Its new batch
    has as many customers (about 600 at all three institutions): the batch-predict tests assert that an
    unchanged batch shows no drift, and PSI on an unchanged distribution is about 10 x (1/batch rows +
    1/training rows). At the default fifth (120 aligned rows, 480 training rows after the held-out split,
    which the workspace's random consortium key chooses) a feature's PSI reached the 0.2 threshold by chance
    in about one run in seven; at 600 it stays below 0.11 over 200 random splits.
    """
    from flows.retrain import retrain

    work = tmp_path_factory.mktemp("trained") / "federation"
    config_path, scenario = small_federation(work, 1200, seed=4, params={"n_estimators": 8, "max_depth": 5},
                                           n_new=1200)
    return Federation(work, config_path, scenario, retrain(str(config_path), agents="local"))


@dataclass(frozen=True)
class CrashReference:
    """A federation nothing has run on yet, and what an uninterrupted run of it registers.

    Copy it to crash a run; the run's result and the bytes of its version's tables are the reference.
    """

    pristine: Federation
    result: dict
    tables: dict[str, bytes]


@pytest.fixture(scope="session")
def crash_reference(tmp_path_factory, prefect_server) -> CrashReference:
    """The crash tests' federation and its uninterrupted run, made once for both crash tests.

    1,500 customers; crashes.PARAMS, checkpointed every 2 trees. Shared by the agent and master crash tests.
    """
    from flows.retrain import retrain

    root = tmp_path_factory.mktemp("crash-reference")
    config_path, scenario = small_federation(root / "pristine", 1500, seed=5, params=CRASH_PARAMS)
    pristine = Federation(root / "pristine", config_path, scenario)
    reference = copy_of(pristine, root / "reference")
    result = retrain(str(reference.config_path), agents="local", predict=False)
    return CrashReference(pristine, result, version_tables(reference.work))
