"""The bins of horizontal boosting, agreed once from the data contracts' declared domains.

As PPD-ERT's histogram thresholds cut each declared domain into equal grid cells (`ppdert/cells.py`), every
numeric feature's declared [low, high] is cut into `max_bins` equal cells by the same `cell_edge`; a
categorical feature has one bin per category code. Nothing about the data decides a bin: master and parties
derive the same edges from the contracts alone, and hello checks they agree (`fingerprint`).

A row's code on a feature is the number of its inner edges below the value (`searchsorted`, left), so
`code <= b` exactly when `value <= edges[b]`: a split at bin b is the model's split `x <= edges[b]`, and the
histograms the parties sum route each row as the model will. A missing value (NaN, or a category outside the
agreed list) takes the last slot, `missing_slot`, and goes right at every split, as in the horizontal forests.
Values outside the declared domain fall in the end bins.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fedcore.horizontal.ppdert.cells import cell_edge
from fedcore.horizontal.schema import HorizontalSchema


@dataclass(frozen=True)
class AgreedBins:
    """Per feature its number of bins and its inner edges (F, width - 2), +inf past a feature's own."""

    n_bins: np.ndarray  # (F,) int64
    edges: np.ndarray  # (F, width - 2) float64

    @classmethod
    def of(cls, schema: HorizontalSchema, low: np.ndarray, high: np.ndarray, max_bins: int) -> AgreedBins:
        """`max_bins` equal cells of each numeric feature's declared domain; one bin per category."""
        categorical = schema.is_categorical
        counts = [len(c.category_list) if categorical[j] else max_bins for j, c in enumerate(schema.columns)]
        n_bins = np.maximum(np.array(counts, dtype=np.int64), 1)
        edges = np.full((len(n_bins), max(int(n_bins.max(initial=1)) - 1, 0)), np.inf)
        for j, n in enumerate(n_bins):
            inner = np.arange(1, n, dtype=np.float64)
            if categorical[j]:
                edges[j, :n - 1] = inner - 0.5
            else:  # monotone whatever the rounding of the weighted means
                edges[j, :n - 1] = np.maximum.accumulate(cell_edge(low[j], high[j], inner, int(n)))
        return cls(n_bins, edges)

    @property
    def width(self) -> int:
        """Histogram slots per feature: the most bins of any feature, plus the missing slot."""
        return int(self.n_bins.max(initial=1)) + 1

    @property
    def missing_slot(self) -> int:
        """The slot of missing values (always right of every split)."""
        return self.width - 1

    def codes(self, X: np.ndarray) -> np.ndarray:
        """Each row's bin per feature, (n_rows, F) uint8 or uint16, row-major for the histogram kernel."""
        dtype = np.uint8 if self.width <= 256 else np.uint16
        out = np.empty(X.shape, dtype=dtype)
        for j, n in enumerate(self.n_bins):
            column = X[:, j]
            code = np.searchsorted(self.edges[j, :n - 1], column, side="left")
            out[:, j] = np.where(np.isnan(column), self.missing_slot, code)
        return np.ascontiguousarray(out)

    def thresholds(self, feature: np.ndarray, split_bin: np.ndarray) -> np.ndarray:
        """The model's threshold of a split at (feature, bin): left when x <= it."""
        return self.edges[feature, split_bin]

    def valid_split(self, feature: np.ndarray, split_bin: np.ndarray) -> np.ndarray:
        """Splits that exist: a known feature and a bin below its last."""
        feature = np.asarray(feature, dtype=np.int64)
        split_bin = np.asarray(split_bin, dtype=np.int64)
        known = (feature >= 0) & (feature < len(self.n_bins))
        bins = np.where(known, self.n_bins[np.where(known, feature, 0)], 0)
        return known & (split_bin >= 0) & (split_bin < bins - 1)

    def fingerprint(self) -> str:
        """SHA-256 of the bins: master and parties check at hello that they cut alike."""
        return hashlib.sha256(self.n_bins.astype("<i8").tobytes()
                              + np.ascontiguousarray(self.edges, "<f8").tobytes()).hexdigest()
