"""Shared task options and artifact helpers."""

from __future__ import annotations

import re

from prefect.cache_policies import NO_CACHE

DATA_LOCAL = {"persist_result": False, "cache_policy": NO_CACHE}
"""Options for tasks whose inputs or outputs hold raw data or live connections: never persisted or cached."""


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits and dashes) from free text."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:100]
