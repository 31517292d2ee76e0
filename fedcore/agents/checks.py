"""What an agent checks of the master's session messages before acting on them, in either setting.

The master is trusted to coordinate, not to read: a held-out set it shrank, or predictions of another shape
than the rows they score, would turn an institution's answers into an oracle for single rows.
"""

from __future__ import annotations

import numpy as np

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message


def expected_holdout(rows: int, fraction: float) -> int:
    """How many of `rows` aligned rows are held out at `fraction` (the master's rule, written once)."""
    return int(round(fraction * rows))


def check_holdout(institution: str, held: int, rows: int, fraction: float | None) -> None:
    """Refuse a held-out set of another size than this institution's own `training.holdout` gives.

    `fraction` None (in-process use without a config) accepts the master's.
    """
    if fraction is None:
        return
    expected = expected_holdout(rows, fraction)
    if held != expected:
        raise ProtocolError(f"institution {institution!r}: the master holds out {held} of {rows} rows; this "
                            f"institution's training.holdout={fraction:g} gives {expected}")


def prediction_values(institution: str, message: Message, rows: int, width: int) -> np.ndarray:
    """The `values` array of `message`: finite float64 of shape (rows, width), or the refusal."""
    values = message.arrays.get("values")
    if values is None:
        raise ProtocolError(f"institution {institution!r}: {message.kind!r} carries no 'values'")
    values = np.asarray(values)
    if values.dtype.kind != "f" or values.shape != (rows, width):
        raise ProtocolError(f"institution {institution!r}: {message.kind!r} values must be floats of shape "
                            f"({rows}, {width}), got {values.dtype} {list(values.shape)}")
    if not np.isfinite(values).all():
        raise ProtocolError(f"institution {institution!r}: {message.kind!r} values must be finite")
    return values.astype(np.float64, copy=False)


REPORTED_DIGITS = 4
"""Significant digits of what an agent reports about its held-out rows: enough to compare models, too few
for predictions crafted per row (say, one power of two each) to be read back label by label."""


def reported(values: np.ndarray | list[float] | float) -> np.ndarray:
    """`values` rounded to REPORTED_DIGITS significant digits (zeros and non-finite values kept)."""
    array = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(array) & (array != 0)
    scale = np.zeros_like(array)
    scale[finite] = np.floor(np.log10(np.abs(array[finite])))
    factor = 10.0 ** (REPORTED_DIGITS - 1 - scale)
    return np.where(finite, np.round(array * factor) / factor, array)


def decision_threshold(message: Message) -> float | None:
    """The `evaluate` message's optional `decision_threshold` in [0, 1] (None: the most probable class)."""
    if "decision_threshold" not in message.header:
        return None
    return message.header.number("decision_threshold", 0.0, 1.0)
