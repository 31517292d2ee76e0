"""An institution's agent in a horizontal boosting federation.

The horizontal agent (`fedcore.horizontal.agent`: contract, setup, evaluate, store, load, predict at home,
checkpoints) with boosting's party (`party.py`) and its protocol's messages; a round's checkpoint holds the
party's margins (on Dask gathered from the blocks). Its rows are in process, or on the institution's Dask
cluster (`compute:`) in the blocks the forests' parties use, with boosting's per-row state beside them.
"""

from __future__ import annotations

import numpy as np

from fedcore.data.binning import MAX_BINS
from fedcore.horizontal.agent import HorizontalInstitutionAgent
from fedcore.horizontal.boosting.party import BOOSTING_PROTOCOL, HorizontalBoostingParty
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.privacy.settings import PrivacySetting, SecureAggregation
from fedcore.protocol.messages import Header


class HorizontalBoostingAgent(HorizontalInstitutionAgent):
    """Answers one institution's side of horizontal boosting sessions."""

    engine_kinds = frozenset(BOOSTING_PROTOCOL.kinds)

    def _party_state(self) -> dict[str, np.ndarray]:
        """A round's checkpoint: the party's margins and rounds started (`round_state`)."""
        return self._boosting_party("a round checkpoint").round_state()

    def _restore_party(self, state: dict[str, np.ndarray]) -> None:
        """The margins of the last round every role completed, taken up by the next hello."""
        self._boosting_party("resume").restore(state)

    def _boosting_party(self, kind: str) -> HorizontalBoostingParty:
        party = self._checkpointed_party(kind)
        assert isinstance(party, HorizontalBoostingParty), "a boosting agent sets up boosting's party"
        return party

    def _make_party(self, h: Header, privacy: PrivacySetting, schema: HorizontalSchema,
                    rows: dict) -> HorizontalBoostingParty:
        """Boosting's party on the training rows (in process or on Dask), with the master's bins."""
        low, high = self._master_domains(h, schema)
        return HorizontalBoostingParty(self.name, schema=schema, low=low, high=high,
                                       max_bins=h.int("max_bins", 2, MAX_BINS),
                                       secure=isinstance(privacy, SecureAggregation), identity=self.identity,
                                       expected_parties=self.data.federation_size, **rows)
