"""Horizontal federations need one schema.

Every institution's contract must declare the same feature columns with the same dtypes and categories, and
the same label with the same classes. This module checks that and returns the shared schema (with the feature
domains PPD-ERT draws thresholds from). Date and timestamp columns train as numbers (days since 1970-01-01
UTC, `fedcore.data.columns`), so their declared ISO bounds become days here.

Contracts are documents the consortium agrees on, not data: comparing them reveals nothing about rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedcore.contracts.model import DATE_DTYPES, ColumnSpec, DataContract, LabelSpec
from fedcore.errors import ContractMismatch

NUMERIC = ("float", "int", *DATE_DTYPES)
"""Contract dtypes the engines read as numbers with a declared domain (dates as days since epoch)."""


@dataclass(frozen=True)
class SharedColumn:
    """A feature column as every institution declares it."""

    name: str
    dtype: str
    categories: tuple | None = None
    low: float | None = None
    """The lowest declared bound over the contracts (dates: in days since epoch)."""
    high: float | None = None


@dataclass(frozen=True)
class SharedSchema:
    """What all institutions of a horizontal federation agree on."""

    columns: tuple[SharedColumn, ...]
    label: str
    classes: tuple | None

    def feature_ranges(self, user: str = "PPD-ERT") -> dict[str, tuple[float, float]]:
        """The declared domain of every numeric column (the hull over contracts).

        For what draws thresholds in them (`user`, named in the refusal: PPD-ERT, FET's DP modes).
        """
        missing = [c.name for c in self.columns if c.dtype in NUMERIC and (c.low is None or c.high is None)]
        if missing:
            raise ContractMismatch(f"{user} draws thresholds from declared domains: declare min and max for "
                                   f"column(s) {missing} in every institution's contract")
        return {c.name: (c.low, c.high) for c in self.columns
                if c.dtype in NUMERIC and c.low is not None and c.high is not None}  # all: checked above


def shared_schema(contracts: dict[str, DataContract]) -> SharedSchema:
    """Check that the institutions' contracts agree.

    Return the shared schema or raise ContractMismatch naming the institution and column that differ from the
    first institution's contract.
    """
    if not contracts:
        raise ContractMismatch("a horizontal federation needs a data contract at every institution")
    (first_name, first), *others = contracts.items()
    labels: dict[str, LabelSpec] = {}
    for name, contract in contracts.items():
        if contract.label is None:
            raise ContractMismatch(f"institution {name!r}: its contract declares no label; in a horizontal "
                                   "federation every institution holds the label")
        labels[name] = contract.label
    first_label = labels[first_name]
    reference = {c.name: c for c in first.columns}
    for name, contract in others:
        _check_same_columns(name, contract, first_name, reference)
        _check_same_label(name, labels[name], first_name, first_label)
    shared = []
    for column in first.columns:
        lows = [_bound(c.min) for contract in contracts.values() for c in contract.columns
                if c.name == column.name]
        highs = [_bound(c.max) for contract in contracts.values() for c in contract.columns
                 if c.name == column.name]
        shared.append(SharedColumn(
            name=column.name, dtype=column.dtype,
            categories=tuple(sorted(map(str, column.categories))) if column.categories is not None else None,
            low=_hull_end(lows, min), high=_hull_end(highs, max)))
    classes = tuple(sorted(first_label.classes, key=str)) if first_label.classes is not None else None
    return SharedSchema(columns=tuple(shared), label=first_label.column, classes=classes)


def _bound(value: float | str | None) -> float | None:
    """A declared bound as a number: a date's ISO text as days since epoch (the value it trains as)."""
    if isinstance(value, str):
        from fedcore.data.columns import instant_days

        return instant_days(value)
    return value


def _hull_end(bounds: list[float | None], end: Callable[[list[float]], float]) -> float | None:
    """`end` (min or max) of the contracts' bounds of a column, or None when a contract declares none."""
    declared = [b for b in bounds if b is not None]
    return end(declared) if len(declared) == len(bounds) else None


def _check_same_columns(name: str, contract: DataContract, first_name: str,
                        reference: dict[str, ColumnSpec]) -> None:
    """Raise ContractMismatch unless `contract` declares the `reference` columns, dtypes and categories."""
    columns = {c.name: c for c in contract.columns}
    missing, extra = sorted(set(reference) - set(columns)), sorted(set(columns) - set(reference))
    if missing or extra:
        parts = ([f"lacks {missing}"] if missing else []) + ([f"has extra {extra}"] if extra else [])
        raise ContractMismatch(f"institution {name!r}: its contract {' and '.join(parts)} compared with "
                               f"{first_name!r}; every institution must declare the same feature columns")
    for column in reference.values():
        theirs = columns[column.name]
        if theirs.dtype != column.dtype:
            raise ContractMismatch(f"institution {name!r}, column {column.name!r}: dtype "
                                   f"{theirs.dtype!r}, but {first_name!r} declares {column.dtype!r}; "
                                   "declare one dtype everywhere")
        if column.categories is not None and set(map(str, theirs.categories or [])) != set(
                map(str, column.categories)):
            raise ContractMismatch(
                f"institution {name!r}, column {column.name!r}: categories "
                f"{sorted(map(str, theirs.categories or []))}, but {first_name!r} declares "
                f"{sorted(map(str, column.categories))}; declare the same categories everywhere (a "
                "category an institution never sees is fine)")


def _check_same_label(name: str, label: LabelSpec, first_name: str, first: LabelSpec) -> None:
    """Raise ContractMismatch unless institution `name`'s label has the column and classes of `first`."""
    if label.column != first.column:
        raise ContractMismatch(f"institution {name!r}: label column {label.column!r}, but "
                               f"{first_name!r} declares {first.column!r}")
    our_classes, their_classes = first.classes, label.classes
    if (our_classes is None) != (their_classes is None) or set(map(str, our_classes or [])) != set(
            map(str, their_classes or [])):
        only_ours = sorted(set(map(str, our_classes or [])) - set(map(str, their_classes or [])))
        only_theirs = sorted(set(map(str, their_classes or [])) - set(map(str, our_classes or [])))
        raise ContractMismatch(
            f"institution {name!r}: label classes differ from {first_name!r} (only at {first_name!r}: "
            f"{only_ours}; only at {name!r}: {only_theirs}); every contract must declare every class of "
            "the federation, also one the institution never sees")
