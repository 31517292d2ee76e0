"""What Prefect keeps of a run: the master flows' summary as their result (JSON), no task's result.

A caller of `run_deployment` reads that summary with `flow_run.state.result()`
(tests/e2e/test_deployments.py); design.md: task results that hold raw data are never persisted.
"""

from __future__ import annotations

import importlib

import pytest
from prefect import Task
from prefect.cache_policies import NO_CACHE
from prefect.serializers import JSONSerializer

from flows.agent import institution_agent
from flows.batch_predict import batch_predict
from flows.retrain import retrain

TASK_MODULES = ("tasks.agents", "tasks.registry", "tasks.session", "tasks.validation", "flows.agent")


def test_the_master_flows_persist_their_summary_as_json_and_the_agent_flow_nothing() -> None:
    for flow in (retrain, batch_predict):
        assert (flow.name, flow.persist_result, flow.result_serializer) == (flow.name, True, "json")
    assert institution_agent.persist_result is None  # Prefect's default: not persisted


def test_no_task_persists_its_result_or_is_cached() -> None:
    tasks = {f"{name}.{attr}": value for name in TASK_MODULES
             for attr, value in vars(importlib.import_module(name)).items() if isinstance(value, Task)}
    assert len(tasks) >= 12
    # a task without its own setting would inherit the flow's persist_result=True
    assert {name for name, task in tasks.items() if task.persist_result is not False} == set()
    assert {name for name, task in tasks.items() if type(task.cache_policy) is not type(NO_CACHE)} == set()


@pytest.mark.slow
def test_the_summary_a_retrain_returns_survives_the_json_result_serializer(trained_federation) -> None:
    serializer = JSONSerializer()
    summary = trained_federation.result
    assert serializer.loads(serializer.dumps(summary)) == summary
    assert {"version", "metrics", "promoted", "production", "prediction"} <= set(summary)
