"""Split one table into simulated parties: vertically (columns) for Federated Forest."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fedcore.errors import ColumnNotFoundError, ParameterError


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
