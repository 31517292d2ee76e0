"""Drift of a batch from the training rows, computed where the data is (issue #33).

When an institution stores a model version it keeps, in its own registry copy, a snapshot of its training
rows: per feature, the training rows' counts in up to ten bins (numbers: cut at the training deciles, plus
missing values; categories: each training category, any other value, missing). At batch prediction it puts
the new rows in the same bins and scores each feature by the population stability index,
PSI = sum over bins of (batch share - training share) x ln(batch share / training share), shares floored at
1e-4 so an empty bin counts but does not make it infinite. The usual reading: below 0.1 stable, 0.1-0.25 some
shift, above 0.25 a large one. Counts are integers and the sums run in bin order: the scores depend on the
rows only, not on the CPU, threads or blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fedcore.errors import ConfigError, ProtocolError

SNAPSHOT_FORMAT = 1
QUANTILES = tuple(q / 10 for q in range(1, 10))
"""The training deciles cut a numeric feature into (at most) ten bins."""
FLOOR = 1e-4
"""The least share a bin counts with, in both distributions."""
ON_DRIFT = ("warn", "fail")


@dataclass(frozen=True)
class DriftSettings:
    """The `drift:` section: which PSI is drift, and what a batch-predict run does about it."""

    psi_threshold: float = 0.2
    """A feature whose batch PSI reaches this has drifted (its institution names it to the master)."""
    on_drift: str = "warn"
    """warn: predict, and the run's final message names the drifted features; fail: the institution refuses
    to predict the batch and the run fails, naming them."""

    @classmethod
    def from_mapping(cls, raw: Any, where: str) -> DriftSettings:
        """Checked settings: an unknown key, a threshold not a positive number, another on_drift: refused."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: drift must be a mapping like {{psi_threshold: 0.2, on_drift: warn}}")
        unknown = sorted(set(raw) - {"psi_threshold", "on_drift"})
        if unknown:
            raise ConfigError(f"{where}: unknown drift setting {unknown[0]!r}; known: psi_threshold, "
                              "on_drift")
        threshold = raw.get("psi_threshold", cls.psi_threshold)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold > 0 \
                or not math.isfinite(threshold):
            raise ConfigError(f"{where}: drift.psi_threshold must be a positive number (0.2 is usual), "
                              f"got {threshold!r}")
        on_drift = raw.get("on_drift", cls.on_drift)
        if on_drift not in ON_DRIFT:
            raise ConfigError(f"{where}: drift.on_drift must be 'warn' or 'fail', got {on_drift!r}")
        return cls(float(threshold), on_drift)


def training_snapshot(frame: pd.DataFrame) -> dict[str, Any]:
    """The training rows' bins and counts per feature column of `frame` (JSON-ready; kept at home)."""
    return {"format": SNAPSHOT_FORMAT, "rows": len(frame),
            "features": {str(c): _feature_snapshot(frame[c]) for c in frame.columns}}


def _is_numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def _feature_snapshot(column: pd.Series) -> dict[str, Any]:
    if _is_numeric(column):
        values = column.to_numpy(dtype=np.float64, na_value=np.nan)
        present = values[~np.isnan(values)]
        edges = np.unique(np.quantile(present, QUANTILES)) if len(present) else np.zeros(0)
        snapshot: dict[str, Any] = {"kind": "numeric", "edges": edges.tolist()}
    else:
        snapshot = {"kind": "categorical", "categories": sorted({str(v) for v in column.dropna()})}
    snapshot["counts"] = _counts(snapshot, column).tolist()
    return snapshot


def _counts(snapshot: dict[str, Any], column: pd.Series) -> np.ndarray:
    """Rows per bin, in the snapshot's bins: its numeric bins or categories (+ other), then missing."""
    missing = column.isna().to_numpy()
    if snapshot["kind"] == "numeric":
        values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        missing = np.isnan(values)
        edges = np.asarray(snapshot["edges"], dtype=np.float64)
        bins = np.searchsorted(edges, values[~missing], side="left")  # (e_i-1, e_i]: the quantiles' side
        n_bins = len(edges) + 1
    else:
        lookup = {c: i for i, c in enumerate(snapshot["categories"])}
        n_bins = len(lookup) + 1  # the last: a category training never saw
        bins = np.array([lookup.get(str(v), n_bins - 1) for v in column[~missing]], dtype=np.int64)
    counts = np.bincount(bins, minlength=n_bins)
    return np.append(counts, int(missing.sum())).astype(np.int64)


def psi(expected: np.ndarray, actual: np.ndarray) -> float:
    """The population stability index of `actual` counts against `expected` counts (same bins)."""
    e = np.maximum(expected / max(int(expected.sum()), 1), FLOOR)
    a = np.maximum(actual / max(int(actual.sum()), 1), FLOOR)
    return float(np.sum((a - e) * np.log(a / e)))


def batch_scores(snapshot: dict[str, Any], batch: pd.DataFrame) -> dict[str, float]:
    """Each snapshot feature's PSI on the batch's rows (none for an empty batch)."""
    return scores_from_counts(snapshot, batch_counts(snapshot, batch), len(batch))


def batch_counts(snapshot: dict[str, Any], batch: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each snapshot feature's rows per bin in `batch`: integers, so blocks of rows add up exactly."""
    counts = {}
    for name, feature in snapshot["features"].items():
        column = batch[name] if name in batch.columns else pd.Series([None] * len(batch), dtype=object)
        counts[name] = _counts(feature, column)
    return counts


def scores_from_counts(snapshot: dict[str, Any], counts: dict[str, np.ndarray],
                       rows: int) -> dict[str, float]:
    """Each feature's PSI from the batch's counts per bin (none for an empty batch)."""
    if not rows:
        return {}
    return {name: psi(np.asarray(feature["counts"], dtype=np.int64), counts[name])
            for name, feature in snapshot["features"].items()}


def reported_drift(institution: str, header: dict) -> dict[str, float]:
    """The drifted features an institution's prediction reply names ({} when none or not checked), checked."""
    drift = header.get("drift", {})
    if not isinstance(drift, dict) or not all(isinstance(k, str) and _score(v) for k, v in drift.items()):
        raise ProtocolError(f"institution {institution!r}: its reply's 'drift' should map feature names to "
                            "PSI scores")
    return {k: float(v) for k, v in drift.items()}


def _score(value: Any) -> bool:
    """Whether `value` is a PSI score: a finite number >= 0 (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= 0)


def drift_note(drift: dict[str, dict[str, float]]) -> str:
    """`; drift at ecommerce: preferred_channel 5.5002, avg_basket 2.7175`: drifted features, most first."""
    return "".join(f"; drift at {name}: " + ", ".join(f"{feature} {psi:.4f}" for feature, psi in
                                                      sorted(features.items(), key=lambda f: (-f[1], f[0])))
                   for name, features in drift.items())
