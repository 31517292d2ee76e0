"""How a vertical federation config deploys: its master session and an institution's agent.

The algorithm registry (`fedcore/algorithms.py`) points the vertical algorithms here, so the callers
(`fedcore.open_session`, `fedcore.agents.serve`) ask the registry and never switch on the setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedcore.trees.params import ForestParams
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.session import VerticalSession

if TYPE_CHECKING:
    from fedcore.config import FederationConfig
    from fedcore.privacy.keyauth import PartyIdentity
    from fedcore.transport.base import Transport


def open_session(config: FederationConfig, transport: Transport) -> VerticalSession:
    """The vertical master session with the config's params, alignment and training settings."""
    settings = config.training
    assert isinstance(config.params, ForestParams)  # the config parses params by its algorithm
    return VerticalSession(transport, config.params, holdout_fraction=settings.holdout,
                           min_overlap=settings.min_overlap, alignment=config.alignment)


def institution_agent(config: FederationConfig, source: Any, name: str,
                      identity: PartyIdentity) -> VerticalInstitutionAgent:
    """Institution `name`'s vertical agent serving `source`, keyed by the consortium key."""
    return VerticalInstitutionAgent(source, config.read_consortium_key(), name=name, identity=identity)
