"""The master session a federation config asks for, in its setting, over a connected transport."""

from __future__ import annotations

from fedcore.config import FederationConfig
from fedcore.session import MasterSession
from fedcore.transport.base import Transport


def open_session(config: FederationConfig, transport: Transport) -> MasterSession:
    """A vertical or horizontal master session with the config's algorithm, privacy and training settings."""
    session = _session(config, transport)
    session.decision_threshold = config.training.decision_threshold
    return session


def _session(config: FederationConfig, transport: Transport) -> MasterSession:
    settings = config.training
    if config.setting == "horizontal":
        from fedcore.horizontal.params import ExtraTreesParams
        from fedcore.horizontal.session import HorizontalSession

        assert isinstance(config.params, ExtraTreesParams)  # the config parses params by its setting
        return HorizontalSession(transport, config.params, algorithm=config.algorithm, privacy=config.privacy,
                                 holdout_fraction=settings.holdout)
    from fedcore.trees.params import ForestParams
    from fedcore.vertical.session import VerticalSession

    assert isinstance(config.params, ForestParams)
    return VerticalSession(transport, config.params, holdout_fraction=settings.holdout,
                           min_overlap=settings.min_overlap, alignment=config.alignment)
