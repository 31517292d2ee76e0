"""Horizontal federations need one schema: every institution's contract must declare the same feature
columns with the same dtypes and categories, and the same label with the same classes. This module
checks that and returns the shared schema (with the feature domains PPD-ERT draws thresholds from).

Contracts are documents the consortium agrees on, not data: comparing them reveals nothing about rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedcore.contracts.model import DataContract
from fedcore.errors import ContractMismatch

NUMERIC = ("float", "int")


@dataclass(frozen=True)
class SharedColumn:
    """A feature column as every institution declares it."""

    name: str
    dtype: str
    categories: tuple | None = None
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class SharedSchema:
    """What all institutions of a horizontal federation agree on."""

    columns: tuple[SharedColumn, ...]
    label: str
    classes: tuple | None

    def feature_ranges(self) -> dict[str, tuple[float, float]]:
        """The declared domain of every numeric column (the hull over contracts), for PPD-ERT."""
        missing = [c.name for c in self.columns if c.dtype in NUMERIC and (c.low is None or c.high is None)]
        if missing:
            raise ContractMismatch(f"PPD-ERT draws thresholds from declared domains: declare min and max for "
                                   f"column(s) {missing} in every institution's contract")
        return {c.name: (c.low, c.high) for c in self.columns if c.dtype in NUMERIC}


def shared_schema(contracts: dict[str, DataContract]) -> SharedSchema:
    """Check that the institutions' contracts agree; return the shared schema or raise ContractMismatch
    naming the institution and column that differ from the first institution's contract."""
    if not contracts:
        raise ContractMismatch("a horizontal federation needs a data contract at every institution")
    (first_name, first), *others = contracts.items()
    for name, contract in contracts.items():
        if contract.label is None:
            raise ContractMismatch(f"institution {name!r}: its contract declares no label; in a horizontal "
                                   "federation every institution holds the label")
    reference = {c.name: c for c in first.columns}
    for name, contract in others:
        columns = {c.name: c for c in contract.columns}
        missing, extra = sorted(set(reference) - set(columns)), sorted(set(columns) - set(reference))
        if missing or extra:
            parts = ([f"lacks {missing}"] if missing else []) + ([f"has extra {extra}"] if extra else [])
            raise ContractMismatch(f"institution {name!r}: its contract {' and '.join(parts)} compared with "
                                   f"{first_name!r}; every institution must declare the same feature columns")
        for column in reference.values():
            theirs = columns[column.name]
            if theirs.dtype != column.dtype:
                raise ContractMismatch(f"institution {name!r}, column {column.name!r}: dtype {theirs.dtype!r}, but "
                                       f"{first_name!r} declares {column.dtype!r}; declare one dtype everywhere")
            if column.categories is not None and set(map(str, theirs.categories or [])) != set(
                    map(str, column.categories)):
                raise ContractMismatch(
                    f"institution {name!r}, column {column.name!r}: categories {sorted(map(str, theirs.categories or []))}"
                    f", but {first_name!r} declares {sorted(map(str, column.categories))}; declare the same "
                    "categories everywhere (a category an institution never sees is fine)")
        if contract.label.column != first.label.column:
            raise ContractMismatch(f"institution {name!r}: label column {contract.label.column!r}, but {first_name!r} "
                                   f"declares {first.label.column!r}")
        ours, theirs = first.label.classes, contract.label.classes
        if (ours is None) != (theirs is None) or (ours is not None and set(map(str, ours)) != set(map(str, theirs))):
            only_ours = sorted(set(map(str, ours or [])) - set(map(str, theirs or [])))
            only_theirs = sorted(set(map(str, theirs or [])) - set(map(str, ours or [])))
            raise ContractMismatch(
                f"institution {name!r}: label classes differ from {first_name!r} (only at {first_name!r}: "
                f"{only_ours}; only at {name!r}: {only_theirs}); every contract must declare every class of "
                "the federation, also one the institution never sees")
    shared = []
    for column in first.columns:
        lows = [c.min for contract in contracts.values() for c in contract.columns if c.name == column.name]
        highs = [c.max for contract in contracts.values() for c in contract.columns if c.name == column.name]
        shared.append(SharedColumn(
            name=column.name, dtype=column.dtype,
            categories=tuple(sorted(map(str, column.categories))) if column.categories is not None else None,
            low=min(lows) if None not in lows else None, high=max(highs) if None not in highs else None))
    classes = tuple(sorted(first.label.classes, key=str)) if first.label.classes is not None else None
    return SharedSchema(columns=tuple(shared), label=first.label.column, classes=classes)
