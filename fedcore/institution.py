"""What an institution brings to a session, in any setting: its table read from the configured files,
checked against its data contract, and the contract result as it may leave the institution."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fedcore.config import FederationConfig
from fedcore.contracts.expectations import ValidationReport
from fedcore.errors import ColumnNotFoundError, DataReadError
from fedcore.protocol.messages import Message

log = logging.getLogger(__name__)


@dataclass
class InstitutionData:
    """What an institution brings to a session: its (validated) table and how to read its new batches."""

    name: str
    frame: pd.DataFrame
    id_column: str
    label: str | None
    registry: Path
    predictions_dir: Path
    load_batch: Callable[[], pd.DataFrame] | None = None
    validation: ValidationReport | None = None

    @property
    def valid(self) -> bool:
        """Whether the table kept its data contract (True when there is no contract)."""
        return self.validation is None or self.validation.success


def institution_from_config(config: FederationConfig, name: str) -> InstitutionData:
    """Load one institution's training table from its configured files and validate it against its
    contract (examples of bad values stay in the local report). Runs where the data lives."""
    inst = config.institution(name)
    frame = read_files(inst.data, f"institution {name!r}")
    report = None
    if inst.contract is not None:
        from fedcore.contracts import load_contract, validate_frame

        contract = load_contract(inst.contract)
        # what leaves the institution carries no example values; the examples go to its own log only
        report = validate_frame(frame, contract, name, include_label=inst.is_label_holder, max_examples=0)
        if not report.success:
            detailed = validate_frame(frame, contract, name, include_label=inst.is_label_holder)
            for line in detailed.failure_lines():
                log.warning("data contract violation (kept local): %s", line)
    elif inst.id_column not in frame.columns:
        raise ColumnNotFoundError(f"institution {name!r}: id column {inst.id_column!r} not in {inst.data!r}")
    batch = (lambda: read_files(inst.predict_data, f"institution {name!r} prediction data")) if inst.predict_data else None
    return InstitutionData(
        name=name, frame=frame, id_column=inst.id_column, label=inst.label, registry=inst.registry,
        predictions_dir=inst.registry.parent / "predictions" / name if inst.predictions is None else inst.predictions,
        load_batch=batch, validation=report,
    )


def read_files(pattern: str, what: str) -> pd.DataFrame:
    """All .parquet/.csv files matching `pattern` (a path or glob) as one table."""
    import glob

    from fedcore.simulate import read_table

    files = sorted(glob.glob(pattern)) or ([pattern] if not glob.has_magic(pattern) else [])
    if not files:
        raise DataReadError(f"{what}: no file matches {pattern!r}")
    return pd.concat([read_table(f) for f in files], ignore_index=True)


def validation_reply(report: ValidationReport | None) -> Message:
    """The contract result for the master: pass/fail and counts per expectation, never example values."""
    if report is None:
        return Message("validation", {"checked": False, "success": True, "rows": [], "errors": []})
    rows = [{k: row[k] for k in ("expectation", "column", "success", "unexpected_count", "expected")}
            for row in report.rows]
    return Message("validation", {"checked": True, "success": report.success, "rows": rows,
                                  "errors": report.failure_lines(), "contract": report.contract,
                                  "contract_version": report.version})
