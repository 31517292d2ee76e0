"""Prefect flows: the master's retrain pipeline, batch prediction, and each institution's agent."""

from typing import TypedDict

AGENT_MODES = ("deployments", "local", "running")
"""How a master flow reaches the agents. deployments: each institution's agent flow on its own pool;
local: processes on this machine (the embedded demo); running: agents that are up already."""


class ResultOptions(TypedDict):
    """Keyword options of `prefect.flow` saying how a return value is kept (typed: `@flow(**...)` checks)."""

    persist_result: bool
    result_serializer: str


RETURNED_SUMMARY: ResultOptions = {"persist_result": True, "result_serializer": "json"}
"""The master flows' (retrain, batch-predict) options: the JSON-ready summary they return is persisted as the
run's result, in the result storage the deployment sets (`fedforest deploy`; default Prefect's local storage),
so `run_deployment(...).state.result()` returns it. Their tasks persist nothing: each says so itself
(`tasks.common.DATA_LOCAL`, `NOT_PERSISTED`)."""
