"""Data contracts: one YAML file per dataset, checked with Great Expectations before any training.

`model` holds the contract (dataclasses, YAML load/dump, inference from a sample); `expectations` turns it
into a GX suite and validates a DataFrame. Importing this package does not import GX (that costs seconds).
"""

from fedcore.contracts.expectations import ContractViolation, ValidationReport, build_suite, validate_frame
from fedcore.contracts.model import (
    ColumnSpec,
    DataContract,
    LabelSpec,
    dump_contract,
    infer_contract,
    load_contract,
    parse_contract,
)

__all__ = [
    "ColumnSpec",
    "ContractViolation",
    "DataContract",
    "LabelSpec",
    "ValidationReport",
    "build_suite",
    "dump_contract",
    "infer_contract",
    "load_contract",
    "parse_contract",
    "validate_frame",
]
