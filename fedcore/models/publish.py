"""Registering a version across the federation, two-phase: it exists at every institution or nowhere.

1. Withdraw what an earlier run left uncommitted: its parts at every institution, then the master's
   pending version (a run killed while registering leaves exactly this).
2. Register the master's version as pending (`ModelRegistry.register(..., pending=True)`): written, not
   visible.
3. Ask every institution to store its part under that version, against the master's signed manifest.
4. Commit: the pending record is removed, and only now do `list`, `show`, `promote`, `resolve` and
   `predict` see the version.

A failure in 3 withdraws the parts stored so far and discards the pending version before re-raising.
A crash anywhere before 4 leaves a pending version that step 1 of the next run removes everywhere; a
crash after 4 leaves a complete version.
"""

from __future__ import annotations

import logging
from typing import Protocol

import pyarrow as pa

from fedcore.models.registry import ModelRegistry

log = logging.getLogger(__name__)


class StoresAtInstitutions(Protocol):
    """What registering needs of a master session (both settings' sessions have it)."""

    def store_at_institutions(self, model_name: str, version: str, manifest: dict) -> dict[str, str]:
        """Store the institutions' parts of a version; returns where each institution stored its part."""

    def withdraw_at_institutions(self, model_name: str, version: str) -> None:
        """Remove a version's parts at every institution."""


def withdraw_uncommitted(registry: ModelRegistry, session: StoresAtInstitutions,
                         model_name: str) -> list[str]:
    """Remove every pending version of `model_name`: first at the institutions, then at the master.

    Returns the versions removed.
    """
    removed = registry.pending(model_name)
    for version in removed:
        log.warning("withdrawing %s %s: an earlier run stopped before every institution stored it",
                    model_name, version)
        session.withdraw_at_institutions(model_name, version)
        registry.discard_pending(model_name, version)
    return removed


def register_everywhere(registry: ModelRegistry, session: StoresAtInstitutions, model_name: str,
                        manifest: dict, tables: dict[str, pa.Table]) -> tuple[str, dict[str, str]]:
    """Register a version at the master and every institution, two-phase (see the module doc).

    Returns the version and where each institution stored its part.
    """
    withdraw_uncommitted(registry, session, model_name)
    version = registry.register(model_name, manifest, tables, pending=True)
    try:
        stored = session.store_at_institutions(model_name, version,
                                               registry.read_manifest(model_name, version, pending=True))
    except BaseException:
        session.withdraw_at_institutions(model_name, version)
        registry.discard_pending(model_name, version)
        raise
    registry.commit(model_name, version)
    return version, stored
