"""The master session a federation config asks for, in its setting, over a connected transport."""

from __future__ import annotations

from fedcore.config import FederationConfig
from fedcore.session import MasterSession
from fedcore.transport.base import Transport


def open_session(config: FederationConfig, transport: Transport) -> MasterSession:
    """A master session with the config's algorithm, privacy and training settings (by the registry)."""
    session = config.implementation.open_session(config, transport)
    session.decision_threshold = config.training.decision_threshold
    return session
