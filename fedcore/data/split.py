"""Split one table into simulated parties.

Vertically (columns) for Federated Forest, horizontally (rows) for Federated Extra-Trees and PPD-ERT.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fedcore.errors import ColumnNotFoundError, ParameterError, PartyShapeError


def split_vertical(
    frame: pd.DataFrame,
    n_parties: int | None = None,
    label: str | None = None,
    *,
    columns: Sequence[Sequence[str]] | None = None,
    label_party: int = 0,
    seed: int = 0,
) -> list[pd.DataFrame]:
    """Split `frame`'s columns into parties that share its rows.

    Either give `columns` (one list per party) or `n_parties` (feature columns shuffled by `seed`, dealt
    out as evenly as possible). The label column, if given, goes to party `label_party`.
    """
    if label is not None and label not in frame.columns:
        more = f", ... ({frame.shape[1]} columns)" if frame.shape[1] > 10 else ""
        shown = ", ".join(repr(c) for c in list(frame.columns)[:10])
        raise ColumnNotFoundError(f"label column {label!r} not in the table; its columns are {shown}{more}")
    features = [c for c in frame.columns if c != label]
    if columns is None:
        if n_parties is None or n_parties < 1:
            raise ParameterError(f"n_parties must be >= 1, got {n_parties}")
        if n_parties > len(features):
            raise ParameterError(f"cannot split {len(features)} feature columns into {n_parties} parties")
        shuffled = [features[i] for i in np.random.default_rng(seed).permutation(len(features))]
        columns = [list(part) for part in np.array_split(np.array(shuffled, dtype=object), n_parties)]
    else:
        columns = [list(c) for c in columns]
        unknown = [c for part in columns for c in part if c not in frame.columns]
        if unknown:
            raise ColumnNotFoundError(f"columns {unknown} not in the table")
    if not 0 <= label_party < len(columns):
        raise ParameterError(f"label_party must be in [0, {len(columns)}), got {label_party}")
    parties = []
    for index, part in enumerate(columns):
        cols = list(part)
        if label is not None and index == label_party and label not in cols:
            cols = cols + [label]
        parties.append(frame[cols].copy())
    return parties


PARTITIONS = ("iid", "column", "dirichlet")


def split_horizontal(
    frame: pd.DataFrame,
    n_parties: int,
    *,
    partition: str = "iid",
    label: str | None = None,
    column: str | None = None,
    alpha: float = 0.5,
    seed: int = 0,
) -> list[pd.DataFrame]:
    """Deal `frame`'s rows out to `n_parties` parties that share its columns.

    - iid: shuffled rows in near-equal shares;
    - column: by the values of `column` (each distinct value, or for numbers each quantile range, goes
      to one party), as when institutions serve different regions;
    - dirichlet: label-skewed: each class's rows are shared out in proportions drawn from
      Dirichlet(alpha, ..., alpha); small alpha gives each party few classes.

    Every party gets at least one row, or a ParameterError says how to get there.
    """
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) or n_parties < 1:
        raise ParameterError(f"n_parties must be an integer >= 1, got {n_parties!r}")
    if partition not in PARTITIONS:
        raise ParameterError(f"partition must be one of {list(PARTITIONS)}, got {partition!r}")
    if n_parties > len(frame):
        raise ParameterError(f"cannot deal {len(frame)} rows out to {n_parties} parties")
    rng = np.random.default_rng(seed)
    if partition == "iid":
        shares = np.array_split(rng.permutation(len(frame)), n_parties)
    elif partition == "column":
        shares = _by_column(frame, n_parties, column)
    else:
        shares = _by_label(frame, n_parties, label, alpha, rng)
    empty = [i for i, rows in enumerate(shares) if len(rows) == 0]
    if empty:
        fix = ("use a larger alpha or another seed" if partition == "dirichlet"
               else f"column {column!r} has fewer distinct values than parties; use fewer parties")
        raise ParameterError(f"the {partition} partition leaves parties {empty} without rows: {fix}")
    return [frame.iloc[np.sort(rows)].reset_index(drop=True) for rows in shares]


def _by_column(frame: pd.DataFrame, n_parties: int, column: str | None) -> list[np.ndarray]:
    """Row positions per party, grouped by a column's values (numbers by quantile range)."""
    if column is None:
        raise ParameterError("the column partition needs column=... (the column whose values decide the "
                             "party)")
    if column not in frame.columns:
        raise ColumnNotFoundError(f"partition column {column!r} not in the table")
    values = frame[column]
    if pd.api.types.is_numeric_dtype(values) and values.nunique() > n_parties:
        ranks = values.rank(method="first").to_numpy()
        party = np.where(np.isnan(ranks), n_parties - 1,
                         np.minimum((np.nan_to_num(ranks) - 1) * n_parties // max(values.notna().sum(), 1),
                                    n_parties - 1)).astype(np.int64)
    else:
        codes, uniques = pd.factorize(values.astype(object).where(values.notna(), "<missing>"), sort=True)
        party = codes % n_parties
    return [np.flatnonzero(party == p) for p in range(n_parties)]


def _by_label(frame: pd.DataFrame, n_parties: int, label: str | None, alpha: float,
              rng: np.random.Generator) -> list[np.ndarray]:
    """Row positions per party with each class split by Dirichlet(alpha) proportions."""
    if label is None or label not in frame.columns:
        raise ParameterError(f"the dirichlet partition needs the label column, got {label!r}")
    if not np.isfinite(alpha) or alpha <= 0:
        raise ParameterError(f"alpha must be a finite number > 0, got {alpha!r} (smaller is more skewed)")
    shares: list[list[np.ndarray]] = [[] for _ in range(n_parties)]
    codes, _ = pd.factorize(frame[label], sort=True)
    for code in np.unique(codes):
        rows = rng.permutation(np.flatnonzero(codes == code))
        cuts = (np.cumsum(rng.dirichlet(np.full(n_parties, alpha)))[:-1] * len(rows)).astype(np.int64)
        for party, part in enumerate(np.split(rows, cuts)):
            shares[party].append(part)
    return [np.concatenate(parts) for parts in shares]


def named_parties(parties: Sequence[pd.DataFrame] | Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Party frames by name (a list gets names party0, party1, ...)."""
    if isinstance(parties, Mapping):
        frames = {str(k): v for k, v in parties.items()}
    elif isinstance(parties, pd.DataFrame):
        raise PartyShapeError("pass a list (or dict) of party DataFrames, not a single DataFrame")
    else:
        frames = {f"party{i}": frame for i, frame in enumerate(parties)}
    if not frames:
        raise PartyShapeError("no parties given: pass at least one party DataFrame")
    for name, frame in frames.items():
        if not isinstance(frame, pd.DataFrame):
            raise PartyShapeError(f"party {name!r} is a {type(frame).__name__}, expected a pandas DataFrame")
    return frames
