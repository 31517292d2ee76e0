"""How a horizontal federation config deploys: its master session and an institution's agent.

The algorithm registry (`fedcore/algorithms.py`) points the horizontal algorithms here, so the callers
(`fedcore.open_session`, `fedcore.agents.serve`) ask the registry and never switch on the setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedcore.horizontal.agent import HorizontalInstitutionAgent
from fedcore.horizontal.boosting.agent import HorizontalBoostingAgent
from fedcore.horizontal.boosting.session import HorizontalBoostingSession
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.session import HorizontalSession
from fedcore.trees.boosting import BoostingParams

if TYPE_CHECKING:
    from fedcore.config import FederationConfig
    from fedcore.privacy.keyauth import PartyIdentity
    from fedcore.transport.base import Transport


def open_session(config: FederationConfig, transport: Transport) -> HorizontalSession:
    """The horizontal forests' master session with the config's algorithm, privacy and held-out share."""
    assert isinstance(config.params, ExtraTreesParams)  # the config parses params by its algorithm
    return HorizontalSession(transport, config.params, algorithm=config.algorithm, privacy=config.privacy,
                             holdout_fraction=config.training.holdout)


def institution_agent(config: FederationConfig, source: Any, name: str,
                      identity: PartyIdentity) -> HorizontalInstitutionAgent:
    """Institution `name`'s horizontal forests' agent serving `source`."""
    return HorizontalInstitutionAgent(source, name=name, identity=identity)


def open_boosting_session(config: FederationConfig, transport: Transport) -> HorizontalBoostingSession:
    """Horizontal boosting's master session with the config's parameters, privacy and held-out share."""
    assert isinstance(config.params, BoostingParams)  # the config parses params by its algorithm
    return HorizontalBoostingSession(transport, config.params, privacy=config.privacy,
                                     holdout_fraction=config.training.holdout)


def boosting_agent(config: FederationConfig, source: Any, name: str,
                   identity: PartyIdentity) -> HorizontalBoostingAgent:
    """Institution `name`'s horizontal boosting agent serving `source`."""
    return HorizontalBoostingAgent(source, name=name, identity=identity)
