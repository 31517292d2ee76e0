"""The master's side of a horizontal boosting session with real institutions.

The horizontal session (`fedcore.horizontal.session`) with boosting's engine: the setup carries the declared
feature domains and the bins they are cut into, the master is `HorizontalBoostingMaster` (masked histograms
under `secagg`, plain ones under `none`), and the manifest states boosting's rounds, learning rate and loss
and its gain importances (each feature's share of the chosen splits' gains, `HorizontalBoostingMaster`).
The model is a `HorizontalForest` with boosting's combination, stored, loaded and predicted as the forests
are.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from fedcore.algorithms import HORIZONTAL_BOOSTING
from fedcore.checkpoints import CheckpointStore
from fedcore.contracts.agreement import SharedSchema
from fedcore.horizontal.boosting.master import HorizontalBoostingMaster
from fedcore.horizontal.contracts import declared_feature_ranges
from fedcore.horizontal.growth import ProgressCallback
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.session import HorizontalSession
from fedcore.privacy.settings import PrivacySetting, SecureAggregation
from fedcore.transport.base import Transport
from fedcore.trees.boosting import BoostingParams


class HorizontalBoostingSession(HorizontalSession):
    """Drives one horizontal boosting session (see the module docstring)."""

    secagg_note = ("the master received only masked sums over the institutions of each node's per feature "
                   "and bin (count, g, h) histograms, and of the label statistics of the base score")

    def __init__(self, transport: Transport, params: BoostingParams,
                 privacy: PrivacySetting | str | dict | None = None, holdout_fraction: float = 0.2,
                 progress: ProgressCallback | None = None) -> None:
        """A master session over `transport` boosting with `params` under `privacy` (default: secagg)."""
        super().__init__(transport, params, HORIZONTAL_BOOSTING.id, privacy, holdout_fraction, progress)
        self.boosting: BoostingParams = params

    def _engine_setup(self, shared: SharedSchema) -> dict[str, Any]:
        """The declared domains and the bins per numeric feature: every party cuts the same bins."""
        assert self.schema is not None, "agree_schema sets the schema first"
        ranges = declared_feature_ranges(shared, "horizontal boosting")
        self._low, self._high = self._domains(self.schema, ranges)
        return {"low": self._low.tolist(), "high": self._high.tolist(), "max_bins": self.boosting.max_bins}

    def _make_master(self) -> HorizontalBoostingMaster:
        """Boosting's level strategy, masking the sums under `secagg` (a fresh session id per run)."""
        assert self.schema is not None, "train() checks the schema is agreed first"
        return HorizontalBoostingMaster(self.transport, self.boosting, self.schema, low=self._low,
                                        high=self._high, secure=isinstance(self.privacy, SecureAggregation),
                                        session_id=secrets.token_bytes(16), progress=self.progress)

    def _fit(self, checkpoints: str | os.PathLike | None, run_id: str | None) -> tuple[HorizontalForest, int]:
        """The trained model and the rounds resumed from checkpoints (with `checkpoints` and `run_id`)."""
        assert isinstance(self.master, HorizontalBoostingMaster), "_make_master builds boosting's"
        if checkpoints is None or run_id is None:
            return self.master.fit(), 0
        store = CheckpointStore(checkpoints, run_id, self._context())
        resumed = self.agree_resume_point(store, run_id)  # before hello: the parties restore their margins
        return self.master.fit(store, resumed), resumed

    def _model_entries(self) -> dict[str, Any]:
        """Boosting's rounds, learning rate, loss and base score, and its gain importances."""
        assert self.model is not None and isinstance(self.master, HorizontalBoostingMaster), "trained first"
        assert self.schema is not None, "a schema is agreed before the model trains"
        n_trees = self.model.n_trees
        importances = self.master.importances()
        return {"boosting": self.boosting.manifest_entry(self.model.combination, n_trees, n_trees,
                                                         self.master.loss.name),
                "importances": dict(zip(self.schema.names, map(float, importances), strict=True))}
