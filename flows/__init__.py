"""Prefect flows: the master's retrain pipeline, batch prediction, and each institution's agent."""

AGENT_MODES = ("deployments", "local", "running")
"""How a master flow reaches the agents. deployments: each institution's agent flow on its own pool;
local: processes on this machine (the embedded demo); running: agents that are up already."""
