"""Everything a Prefect server holds, page by page.

A server answers a read with at most `PREFECT_API_DEFAULT_LIMIT` (200) rows. A session's test server holds
every flow's artifacts and logs, so a test that reads once sees an arbitrary 200 of them: it can miss the
artifact it looks for, or scan only part of the logs it says hold no raw values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PAGE = 200  # the server's largest page (PREFECT_API_DEFAULT_LIMIT)


def every(read: Callable[..., list], **filters: Any) -> list:
    """All the rows `read` (a client's read_artifacts, read_logs, read_flow_runs) returns, every page."""
    rows: list = []
    while True:
        page = read(limit=PAGE, offset=len(rows), **filters)
        rows.extend(page)
        if len(page) < PAGE:
            return rows


def all_artifacts(client: Any) -> list:
    """Every artifact on the server."""
    return every(client.read_artifacts)


def all_logs(client: Any, log_filter: Any = None) -> list:
    """Every log line on the server (or those `log_filter` keeps)."""
    return every(client.read_logs, log_filter=log_filter)


def all_flow_runs(client: Any) -> list:
    """Every flow run on the server."""
    return every(client.read_flow_runs)
