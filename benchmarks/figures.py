"""The accuracy-against-epsilon axis the DP benchmarks share: epsilon ticks, ExtraTrees and 3 pp below."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def epsilon_axis(axis: Any, epsilons: Sequence[float], reference: float, reference_label: str,
                 xlabel: str) -> None:
    """Set up a matplotlib axis whose curves are already drawn with `semilogx`.

    Ticks at `epsilons` (no minor ticks), the non-private reference accuracy and 3 pp below it as
    horizontal lines (the issues' targets), the labels and a grid.
    """
    axis.set_xticks(list(epsilons), [f"{e:g}" for e in epsilons])
    axis.minorticks_off()
    axis.axhline(reference, color="black", label=reference_label)
    axis.axhline(reference - 0.03, color="black", linestyle=":", label="ExtraTrees - 3 pp")
    axis.set_xlabel(xlabel)
    axis.set_ylabel("test accuracy")
    axis.grid(alpha=0.3, which="both")
