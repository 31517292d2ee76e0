"""The master's per-feature domains, checked by an institution before it cuts bins or cells in them.

PPD-ERT's thresholds and horizontal boosting's bins are cut in the domains the master sends at setup. An
honest master sends the hull of the institutions' declared ranges (`SharedSchema.feature_ranges`) and each
categorical column's code range, so every institution can check what it gets: finite numbers, low <= high,
the categories' codes exactly, and a numeric domain holding the range its own contract declares.
"""

from __future__ import annotations

import numpy as np

from fedcore.errors import ProtocolError
from fedcore.horizontal.schema import HorizontalSchema


def checked_domains(institution: str, schema: HorizontalSchema, low: np.ndarray, high: np.ndarray,
                    declared: dict[str, tuple[float, float]] | None) -> tuple[np.ndarray, np.ndarray]:
    """`(low, high)` if an honest master could have sent them, else a ProtocolError naming the feature.

    `declared` is the institution's own contract's numeric ranges (None without a contract: in-process use,
    where only the numbers' shape is checked).
    """
    codes_low, codes_high = schema.feature_domains()
    for j, column in enumerate(schema.columns):
        got = f"[{float(low[j])!r}, {float(high[j])!r}]"
        if column.is_categorical:
            if low[j] != codes_low[j] or high[j] != codes_high[j]:
                raise _refused(institution, column.name, f"is {got}; its {len(column.category_list)} "
                               f"categories' codes are [{codes_low[j]:g}, {codes_high[j]:g}]")
            continue
        if not (np.isfinite(low[j]) and np.isfinite(high[j]) and low[j] <= high[j]):
            raise _refused(institution, column.name, f"is {got}; a domain is two finite numbers, low <= high")
        if declared is not None:
            own_low, own_high = declared[column.name]
            if low[j] > own_low or high[j] < own_high:
                raise _refused(institution, column.name, f"is {got}, which does not hold the range "
                               f"[{own_low!r}, {own_high!r}] its data contract declares")
    return low, high


def _refused(institution: str, feature: str, why: str) -> ProtocolError:
    """The one refusal of a master's domain, naming the institution and the feature."""
    return ProtocolError(f"institution {institution!r}: the master's domain for feature {feature!r} {why}; "
                         "refusing to set up")
