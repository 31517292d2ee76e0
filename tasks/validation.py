"""Collecting the institutions' data-contract results before any training."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from fedcore.errors import ContractViolation
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport
from tasks.common import DATA_LOCAL, artifact_key


@task(**DATA_LOCAL)
def collect_validation(transport: Transport) -> dict[str, dict]:
    """Each institution's per-expectation results as a table artifact; stop the run on any violation.

    Only pass/fail and counts cross: the example values behind a failure are raw data and stay in the
    institution's own report and agent log.
    """
    replies = transport.exchange({name: Message("validation_report") for name in transport.parties})
    summary, errors = {}, []
    for name, reply in replies.items():
        h = reply.header
        summary[name] = {"checked": h["checked"], "success": h["success"], "expectations": len(h["rows"]),
                         "contract": h.get("contract"), "contract_version": h.get("contract_version")}
        if h["checked"]:
            rows = [{**row, "success": {True: "pass", False: "FAIL", None: "not checked"}[row["success"]]}
                    for row in h["rows"]]
            create_table_artifact(rows, key=artifact_key("validation", name),
                                  description=f"Data contract {h['contract']} v{h['contract_version']} at "
                                              f"{name}: {'passed' if h['success'] else 'FAILED'}")
        errors += h["errors"]
        get_run_logger().info("validation at %s: %s", name, "passed" if h["success"] else "FAILED")
    if errors:
        raise ContractViolation("; ".join(errors), institution=", ".join(
            n for n, s in summary.items() if not s["success"]), failures=[])
    return summary
