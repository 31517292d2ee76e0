"""Each row's LDP instant report, drawn by the production per-row kernel (tests' reference).

`ldp_draws.instant_report` is what `fedcore.trees.rowwork.ldp_report_sums` draws for each row where it
sums the reports; the tests draw every row's report with it, one row at a time, to check the sums and the
mechanism's probabilities. fedcore itself never needs a table of reports.
"""

from __future__ import annotations

import numpy as np

from fedcore.privacy import ldp_draws
from fedcore.privacy.ldp import LabelLDP


def instant_bits(ldp: LabelLDP, permanent: np.ndarray, key: np.ndarray, report: int = 0, slot: int = 0,
                 first_row: int = 0) -> np.ndarray:
    """Rows first_row, first_row + 1, ...'s instant reports of `permanent` (uint8, its shape)."""
    permanent = np.ascontiguousarray(permanent, dtype=np.uint8)
    out = np.empty_like(permanent)
    if_one, if_zero = ldp.instant_thresholds()
    key = ldp_draws.check_key(key)
    for i in range(permanent.shape[0]):
        ldp_draws.instant_report(permanent[i], key, np.uint64(first_row + i), np.uint64(slot),
                                 np.uint64(report), if_one, if_zero, out[i])
    return out
