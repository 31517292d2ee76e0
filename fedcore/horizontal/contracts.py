"""From the institutions' agreed data contracts to the horizontal engine's schema and numeric domains.

In a real federation nothing about the schema is read off the data: column kinds, category lists,
classes and (for PPD-ERT and FET's DP modes) numeric domains all come from the contracts the consortium
signed off.
"""

from __future__ import annotations

import math

from fedcore.contracts.agreement import SharedSchema
from fedcore.contracts.model import DataContract
from fedcore.errors import ContractMismatch
from fedcore.horizontal.schema import CATEGORICAL, NUMERIC, ColumnSpec, HorizontalSchema

NUMERIC_DTYPES = ("float", "int", "bool", "date", "timestamp")
"""Contract dtypes the engine reads as numbers (dates as days since epoch, converted by the agents)."""


def engine_schema(shared: SharedSchema, task: str) -> HorizontalSchema:
    """The engine's schema for the contracts' shared schema (classification needs declared classes)."""
    columns = []
    for column in shared.columns:
        if column.dtype in NUMERIC_DTYPES:
            columns.append(ColumnSpec(column.name, NUMERIC))
        elif column.categories is not None:
            columns.append(ColumnSpec(column.name, CATEGORICAL, tuple(str(c) for c in column.categories)))
        else:
            raise ContractMismatch(f"column {column.name!r} is dtype {column.dtype!r} without declared "
                                   "categories: a horizontal federation encodes text columns by their "
                                   "agreed categories, so declare 'categories' in every contract (or drop "
                                   "the column)")
    classes = None
    if task == "classification":
        if not shared.classes:
            raise ContractMismatch(f"label {shared.label!r}: a classification federation needs the classes "
                                   "declared in every contract (label: {column: ..., classes: [...]})")
        classes = tuple(sorted(shared.classes, key=str))
    return HorizontalSchema(columns=tuple(columns), label=shared.label, task=task, classes=classes)


def declared_feature_ranges(shared: SharedSchema, user: str = "PPD-ERT") -> dict[str, tuple[float, float]]:
    """The numeric domains thresholds are drawn in, from the contracts (bool columns are 0..1, dates in days).

    `user` (PPD-ERT, or FET in a DP mode) is named when a contract declares no range.
    """
    ranges = {c.name: (0.0, 1.0) for c in shared.columns if c.dtype == "bool"}
    numeric = SharedSchema(columns=tuple(c for c in shared.columns if c.dtype != "bool"
                                         and c.dtype in NUMERIC_DTYPES),
                           label=shared.label, classes=shared.classes)
    return {**ranges, **{k: (float(lo), float(hi)) for k, (lo, hi) in numeric.feature_ranges(user).items()}}


def declared_y_exponent(contract: DataContract) -> int | None:
    """The largest y_exponent an honest regression party under `contract` can state; None without a bound.

    Its contract's label range [min, max] (both declared, finite) holds every label it trains on (an agent
    whose data breaks its contract takes no part), so |y| <= max(|min|, |max|), and frexp's exponent, which
    the party states (`HorizontalParty._on_hello`), only grows with the magnitude.
    """
    label = contract.label
    if label is None or label.min is None or label.max is None:
        return None
    try:
        bound = max(abs(float(label.min)), abs(float(label.max)))
    except OverflowError:  # an integer beyond float64: no bound a label can reach
        return None
    return int(math.frexp(bound)[1]) if math.isfinite(bound) else None
