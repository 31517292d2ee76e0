"""Built-in datasets and table loading: Breiman's waveform-21 generator and a Parquet/CSV reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedcore.data.dialect import CsvDialect, read_csv
from fedcore.errors import DataReadError

WAVEFORM_N_FEATURES = 21
# Each class mixes two of the three base waves h1, h2, h3 (Breiman et al., CART, 1984, p. 49).
_WAVEFORM_CLASS_WAVES = ((0, 1), (0, 2), (1, 2))


def waveform_base_waves() -> np.ndarray:
    """The three base waves as a (3, 21) array: h1, h2, h3 peak (height 6) at i = 7, 15 and 11."""
    i = np.arange(1, WAVEFORM_N_FEATURES + 1)
    centres = np.array([7, 15, 11])[:, None]
    return np.maximum(6 - np.abs(i[None, :] - centres), 0).astype(np.float64)


def make_waveform(n_samples: int = 5000, random_state: int = 0) -> pd.DataFrame:
    """Breiman's waveform-21 data: columns x1..x21 and an int label `class` in {0, 1, 2}.

    Per row: class c uniform in {0, 1, 2}, one u ~ U(0, 1) and noise e_i ~ N(0, 1) per attribute; class 0
    is u*h1 + (1-u)*h2 + e, class 1 is u*h1 + (1-u)*h3 + e, class 2 is u*h2 + (1-u)*h3 + e. Shipped so
    the paper figures (FF and FET report waveform accuracy) can be reproduced without a download.
    """
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    rng = np.random.default_rng(random_state)
    labels = rng.integers(0, 3, size=n_samples)
    u = rng.random(n_samples)[:, None]
    noise = rng.standard_normal((n_samples, WAVEFORM_N_FEATURES))
    waves = waveform_base_waves()
    pairs = np.asarray(_WAVEFORM_CLASS_WAVES)[labels]
    values = u * waves[pairs[:, 0]] + (1.0 - u) * waves[pairs[:, 1]] + noise
    frame = pd.DataFrame(values, columns=[f"x{i}" for i in range(1, WAVEFORM_N_FEATURES + 1)])
    frame["class"] = labels.astype(np.int64)
    return frame


def load_table(path: str | Path, dialect: CsvDialect | None = None) -> pd.DataFrame:
    """Read a party's table from a .parquet or .csv file (`dialect`: how the CSV is written).

    Any other suffix is refused with a DataReadError.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix == ".csv":
        return read_csv(str(path), dialect)
    raise DataReadError(f"cannot read {str(path)!r}: expected a .parquet or .csv file, found suffix "
                        f"{suffix!r}")
