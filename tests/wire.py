"""Searching recorded transcripts for raw data: the helpers of the transcript tests.

A value can cross in a payload as array bytes (float64 anywhere in the Arrow buffers) or as text in the
JSON header; strings (IDs, labels, names) cross as their UTF-8 bytes either way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pandas as pd

NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
"""A decimal number with a fraction, as JSON or YAML writes a float."""


def float_windows(payload: bytes) -> np.ndarray:
    """Every 8-byte window of a payload (at every offset) as uint64: what a float64 could be stored as."""
    raw = np.frombuffer(payload, dtype=np.uint8)
    if len(raw) < 8:
        return np.zeros(0, np.uint64)
    windows = np.lib.stride_tricks.sliding_window_view(raw, 8)
    return np.ascontiguousarray(windows).view("<u8").reshape(-1)


def raw_values_in(payload: bytes, raw_bits: np.ndarray) -> int:
    """How many distinct raw float64 values (given as their uint64 bit patterns) occur in the payload."""
    return int(np.isin(raw_bits, float_windows(payload)).sum())


def float_bits(values) -> np.ndarray:
    """Sorted unique uint64 bit patterns of float64 values (the form the searches compare)."""
    return np.unique(np.asarray(values, dtype="<f8").reshape(-1).view("<u8"))


def continuous_bits(frames: list[pd.DataFrame], columns: list[str]) -> np.ndarray:
    """Bit patterns of the continuous values (non-integral floats) of these columns at these parties."""
    values = np.concatenate([f[c].to_numpy(dtype=np.float64) for f in frames for c in columns])
    values = values[np.isfinite(values) & (values != np.round(values))]
    return float_bits(values)


def header_leaves(value) -> Iterator[object]:
    """Every scalar in a JSON header (dict keys included), depth first."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from header_leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from header_leaves(item)
    else:
        yield value


def header_float_bits(header: dict) -> np.ndarray:
    """Bit patterns of every float in a header: JSON numbers, and numbers written inside strings (YAML)."""
    found: list[float] = []
    for leaf in header_leaves(header):
        if isinstance(leaf, float):
            found.append(leaf)
        elif isinstance(leaf, str):
            found.extend(float(token) for token in NUMBER.findall(leaf))
    return float_bits(found) if found else np.zeros(0, np.uint64)


def found_bits(payload: bytes, header: dict, wanted: np.ndarray) -> np.ndarray:
    """The values of `wanted` (bit patterns) that occur in a payload, as array bytes or as header text."""
    if not len(wanted):
        return wanted
    hits = wanted[np.isin(wanted, float_windows(payload))]
    return np.union1d(hits, np.intersect1d(wanted, header_float_bits(header)))
