"""Horizontal boosting's parameters: a config's `params:` read, and what the engine cannot run yet refused.

The estimators and a federation config read the same defaults (64 bins a numeric feature) and refuse the
same parameters, so a deployed run and the estimator grow the same model for the same seed.
"""

from __future__ import annotations

from typing import Any

from fedcore.errors import ParameterError
from fedcore.trees.boosting import BoostingParams

DEFAULT_BINS = 64
"""Bins per numeric feature: the histograms are dense under secure aggregation (a sparse one would tell
the master which bins a party holds), so their bytes and masks grow with the bins."""


def from_config(values: dict, privacy: Any) -> BoostingParams:
    """A horizontal config's `params:` by XGBoost's names, `max_bins` defaulting to the estimators' 64."""
    return BoostingParams.from_config({"max_bins": DEFAULT_BINS, **values})


def check_subsample(subsample: float) -> None:
    """Refuse row subsampling: a row's draw would depend on which party holds it."""
    if subsample != 1.0:
        raise ParameterError("horizontal boosting takes subsample=1.0 only so far: a row's draw would "
                             "depend on which party holds it, and 1, 2, 3 parties must grow the same model")


def check_params(privacy: Any, params: BoostingParams) -> None:
    """What a federation config may not ask of horizontal boosting (the registry's `check_params`).

    No subsampling, no early stopping (not yet). PPD-ERT's threshold fields under `secagg` are refused by the
    config as written (`Algorithm.fieldless_modes`): boosting's bins are `params.max_bins` equal cells of the
    declared domains.
    """
    check_subsample(params.subsample)
    if params.early_stopping_rounds is not None:
        raise ParameterError("horizontal boosting has no early stopping yet: remove early_stopping_rounds")
