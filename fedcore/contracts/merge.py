"""One validation report from the reports of a table's blocks, equal to the whole table's (issue #29).

Each block of an institution's table is validated on its own (`validate_frame`, no examples) where it is
read; this merges the blocks' rows, expectation by expectation, into what validating the whole table gives:

* row-wise counts (not null, in set, between, value types): the unexpected counts add up;
* schema-level rows (column exists, the column set, a column's dtype, "not checked"): every block reads the
  same columns with the whole table's dtypes (`fedcore.compute.dask_table`), so they agree; the first is kept;
* the row count: checked again on the total against the contract's bounds;
* uniqueness of the ID column is not row-wise (a value may repeat across blocks): its count is computed over
  the whole column by the caller (`fedcore.compute.dask_validation`, an exact count of duplicated values)
  and passed in as `duplicates`;
* a range or category check of a column whose dtype check failed is "not checked", as in the whole table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedcore.contracts.expectations import (
    BETWEEN,
    IN_SET,
    ROW_COUNT,
    TYPE_LIST,
    UNIQUE,
    ValidationReport,
    counted_found,
)
from fedcore.contracts.model import DataContract

WRONG_TYPE = "not checked: the column has the wrong dtype"


def merge_reports(parts: Sequence[ValidationReport], contract: DataContract, n_rows: int,
                  duplicates: int | None) -> ValidationReport:
    """The whole table's report from its blocks' `parts` (at least one; block order), see the module doc.

    `duplicates`: rows of the ID column whose non-null value occurs more than once in the whole table (None
    when the column is missing, so its uniqueness is "not checked" in every block).
    """
    first = parts[0]
    rows: list[dict[str, Any]] = []
    for index, row in enumerate(first.rows):
        same = [part.rows[index] for part in parts]
        merged = dict(row, examples=[])
        failed = next((r for r in same if r["found"].startswith("GX could not check it")), None)
        if row["success"] is None or row["unexpected_count"] is None and row["expectation"] != ROW_COUNT:
            if failed is not None:
                merged = dict(failed, examples=[])
        elif row["expectation"] == ROW_COUNT:
            low, high = contract.row_count or (None, None)
            merged.update(success=(low is None or n_rows >= low) and (high is None or n_rows <= high),
                          found=f"found {n_rows} rows")
        elif failed is not None:
            merged = dict(failed, examples=[])
        else:
            count = duplicates if row["expectation"] == UNIQUE else sum(
                r["unexpected_count"] for r in same if r["unexpected_count"] is not None)
            merged.update(success=not count, unexpected_count=int(count or 0),
                          found=counted_found(row["expectation"], count, expected=row["expected"]))
        rows.append(merged)
    wrong_type = {r["column"] for r in rows if r["expectation"] == TYPE_LIST and r["success"] is False}
    for row in rows:
        if row["expectation"] in (BETWEEN, IN_SET) and row["column"] in wrong_type:
            row.update(success=None, unexpected_count=None, found=WRONG_TYPE)
    return ValidationReport(institution=first.institution, contract=first.contract, version=first.version,
                            success=all(r["success"] is not False for r in rows), rows=rows,
                            seconds=sum(p.seconds for p in parts))
