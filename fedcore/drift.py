"""Drift of a batch from the training rows, computed where the data is (issue #33).

When an institution stores a model version it keeps, in its own registry copy, a snapshot of its training
rows: per feature, the training rows' counts in up to ten bins (numbers: cut at the training deciles, plus
missing values; categories: each training category, any other value, missing). At batch prediction it puts
the new rows in the same bins and scores each feature by the population stability index,
PSI = sum over bins of (batch share - training share) x ln(batch share / training share), shares floored at
1e-4 so an empty bin counts but does not make it infinite. The usual reading: below 0.1 stable, 0.1-0.25 some
shift, above 0.25 a large one. Counts are integers and the sums run in bin order: the scores depend on the
rows only, not on the CPU, threads or blocks.

The deciles come from a sample of the training rows: row i (its position in the training rows) is in it
when the counter-based Philox word at i under the fixed `SAMPLE_SEED` falls below the share
`SAMPLE_ROWS / rows` (every row up to `SAMPLE_ROWS` rows: the exact deciles). A row's draw depends on its
position only, so rows counted where they are, in blocks on Dask workers (`fedcore.compute.dask_drift`),
give the sample, and so the snapshot, of the whole table in one process (`snapshot_from_blocks`). The seed
is fixed, not the training's, so two versions trained on the same rows keep the same snapshot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np
import pandas as pd

from fedcore import philox
from fedcore.errors import ConfigError, ProtocolError
from fedcore.randomness import counter_key

SNAPSHOT_FORMAT = 1
QUANTILES = tuple(q / 10 for q in range(1, 10))
"""The training deciles cut a numeric feature into (at most) ten bins."""
FLOOR = 1e-4
"""The least share a bin counts with, in both distributions."""
ON_DRIFT = ("warn", "fail")
SAMPLE_ROWS = 100_000
"""About as many training rows as the deciles are taken from (all of them up to this many)."""
SAMPLE_SEED = 20_331
"""The fixed seed of that sample (`counter_key`), so the snapshot depends on the rows only."""


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
    bins = snapshot_bins([block_summary(frame, 0, len(frame))], len(frame))
    return with_counts(bins, batch_counts(bins, frame))


def _is_numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


@nb.njit(cache=True)
def _sampled(key: np.ndarray, start: int, n: int, below: np.uint64) -> np.ndarray:
    """Whether each of rows start..start+n-1 is in the decile sample: its Philox word's top 53 bits."""
    out = np.empty(n, np.bool_)
    zero = np.uint64(0)
    for i in range(n):
        out[i] = (philox.word(key, 0, np.uint64(start + i), zero, zero) >> np.uint64(11)) < below
    return out


def sample_mask(start: int, n: int, rows: int) -> np.ndarray:
    """Which of training rows [start, start + n) of `rows` the deciles are taken from (see the module doc)."""
    if rows <= SAMPLE_ROWS:
        return np.ones(n, bool)
    below = np.uint64(SAMPLE_ROWS * 2**53 // rows)
    return _sampled(counter_key(SAMPLE_SEED, "drift_deciles"), start, n, below)


def block_summary(frame: pd.DataFrame, start: int, rows: int) -> dict[str, Any]:
    """What the bins need from a block of training rows (training rows [start, ...) of `rows`).

    Per column: a numeric one's sampled present values (`sample_mask`), a categorical one's categories.
    """
    keep = sample_mask(start, len(frame), rows)
    summary: dict[str, Any] = {}
    for name in frame.columns:
        column = frame[name]
        if _is_numeric(column):
            values = column.to_numpy(dtype=np.float64, na_value=np.nan)[keep]
            summary[str(name)] = values[~np.isnan(values)]
        else:
            summary[str(name)] = {str(v) for v in column.dropna()}
    return summary


def snapshot_bins(summaries: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """The snapshot's bins, without counts, from its blocks' summaries (`block_summary`, in block order)."""
    features: dict[str, Any] = {}
    for name, first in summaries[0].items() if summaries else ():
        parts = [s[name] for s in summaries]
        if isinstance(first, np.ndarray):
            present = np.concatenate(parts)  # the deciles sort: the blocks' order does not matter
            edges = np.unique(np.quantile(present, QUANTILES)) if len(present) else np.zeros(0)
            features[name] = {"kind": "numeric", "edges": edges.tolist()}
        else:
            features[name] = {"kind": "categorical", "categories": sorted(set().union(*parts))}
    return {"format": SNAPSHOT_FORMAT, "rows": rows, "features": features}


def with_counts(bins: dict[str, Any], counts: dict[str, np.ndarray]) -> dict[str, Any]:
    """The snapshot: its bins (`snapshot_bins`) with the training rows' counts in them."""
    return {**bins, "features": {name: {**feature, "counts": counts[name].tolist()}
                                 for name, feature in bins["features"].items()}}


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


def summed_counts(parts: list[dict[str, np.ndarray]], snapshot: dict[str, Any]) -> dict[str, np.ndarray]:
    """Blocks' counts per bin (`batch_counts`), added up in block order: integers, exact in any order."""
    total: dict[str, np.ndarray] = {}
    for name, feature in snapshot["features"].items():
        kind = "edges" if feature["kind"] == "numeric" else "categories"
        total[name] = np.zeros(len(feature[kind]) + 2, np.int64)  # its bins (+ other), then missing
        for part in parts:
            total[name] += part[name]
    return total


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
