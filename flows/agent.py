"""An institution's agent for one training session, as a Prefect flow on the institution's own work pool.

The master's `retrain` flow starts it with `run_deployment("institution-agent/<name>")`. Its data-local
steps (load, validate against the contract) show as tasks of this flow run. It then serves the session
over Arrow Flight with mutual TLS until the master closes it, and its run's log says what it stored and
wrote (the version, the predictions file). Nothing it returns or logs holds raw data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from fedcore import agents
from fedcore.agents.data import InstitutionData, institution_from_config
from fedcore.agents.serve import build_institution_server, serve_until_session_closed
from fedcore.compute.cluster import held_cluster
from fedcore.config import FederationConfig, load_config
from fedcore.errors import ContractViolation
from fedcore.transport.allocator import limit_malloc_arenas
from tasks.common import DATA_LOCAL, artifact_key


@task(**DATA_LOCAL)
def load_and_validate(config: FederationConfig, institution: str) -> InstitutionData:
    """Read the institution's files and check them against its data contract (results as an artifact)."""
    data = institution_from_config(config, institution)
    if data.validation is not None:
        rows = [{k: r[k] for k in ("expectation", "column", "success", "unexpected_count", "expected")}
                for r in data.validation.rows]
        create_table_artifact(rows, key=artifact_key("contract", institution),
                              description=f"{institution}: {'passed' if data.valid else 'FAILED'}")
    get_run_logger().info("%s: %d rows loaded, contract %s", institution, data.n_rows,
                          "passed" if data.valid else "FAILED")
    return data


@task(**DATA_LOCAL)
def serve_session(config: FederationConfig, institution: str, data: InstitutionData) -> int:
    """Answer the master over Flight until it closes the session; returns the number of sessions served.

    It fails (and so does the agent run) when the party refused or failed on one of the session's messages,
    quoting that one line, or when the master never came or went silent (`serve_until_session_closed`).
    """
    server = build_institution_server(config, institution, data=data)
    get_run_logger().info("%s serving on %s", institution, config.institution(institution).endpoint)
    try:
        serve_until_session_closed(server, idle_timeout_s=config.training.agent_idle_timeout_s)
    finally:  # what the agent keeps for its own eyes (its features' importances, a batch's drift)
        for name, rows in server.party.reports.items():
            create_table_artifact(rows, key=artifact_key(name, institution),
                                  description=f"{institution}: {REPORTS.get(name, name)}")
    return server.party.sessions


REPORTS = {"importances": "impurity importances of its own features (kept here; the master sees their sum)",
           "drift": "population stability index of each feature of the last batch against its training rows"}
"""What each of an agent's reports (`SessionAgent.reports`) shows, as its artifact's description."""


class _ToRunLogger(logging.Handler):
    """Passes records to a Prefect run logger (which may be called from the Flight server's threads)."""

    def __init__(self, run_logger: logging.Logger | logging.LoggerAdapter) -> None:
        super().__init__(logging.INFO)
        self.run_logger = run_logger

    def emit(self, record: logging.LogRecord) -> None:
        self.run_logger.log(record.levelno, record.getMessage())


@contextmanager
def agent_log_in_run() -> Iterator[None]:
    """While open, what the agent logs for its operator also goes to this flow run's log in the Prefect UI.

    That is the `fedcore.agents` log: contract violations, versions stored, predictions written.
    """
    source = agents.log
    handler, level = _ToRunLogger(get_run_logger()), source.level
    source.addHandler(handler)
    if source.getEffectiveLevel() > logging.INFO:
        source.setLevel(logging.INFO)
    try:
        yield
    finally:
        source.removeHandler(handler)
        source.setLevel(level)


@flow(name="institution-agent")
def institution_agent(config_path: str, institution: str) -> dict:
    """Load, validate and serve one institution's data for one session of the master's retrain flow."""
    limit_malloc_arenas()  # before the cluster's and the server's threads start (AgentServer does it late)
    config = load_config(config_path)
    # with compute: dask, the process's cluster is held for the run: let go (closed) when it ends or fails,
    # a failed load or a server that could not start included
    with agent_log_in_run(), held_cluster(config.institution(institution).compute):
        data = load_and_validate(config, institution)
        # also when invalid: the master reports it for all
        sessions = serve_session(config, institution, data)
    if not data.valid:
        assert data.validation is not None, "only a contract's report makes data invalid"
        failed = [r for r in data.validation.rows if not r["success"]]
        raise ContractViolation(f"institution {institution!r}: {len(failed)} expectation(s) of its data "
                                "contract failed; see the "
                                f"{artifact_key('contract', institution)!r} artifact",
                                institution=institution, failures=failed)
    return {"institution": institution, "valid": data.valid, "sessions": sessions}
