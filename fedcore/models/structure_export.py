"""A version's tree tables as one JSON document: what of a vertical model can leave the federation.

A vertical model has no runnable export: each split's feature and threshold stay at its owner
(docs/design.md, Export). What a registry holds can still be read by other tools: the master's copy has the
structure (tree, node, children, depth, owning party, node values) and how the trees combine; an
institution's copy has its own splits (feature, threshold, categories, missing direction) on the nodes it
owns. A horizontal version's one table holds the whole model. Nothing is added or derived: the document is
the verified tables, row for row, with their schema metadata.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa

STRUCTURE_FORMAT = "fedforest.tree-tables/1"


def structure_document(manifest: dict, tables: dict[str, pa.Table]) -> dict[str, Any]:
    """The JSON document of a loaded version: its identity and every table as metadata plus rows.

    A float that is not a number (NaN: no value at that node) becomes null, so the document is strict JSON.
    """
    return {"format": STRUCTURE_FORMAT,
            **{key: manifest.get(key) for key in ("model_name", "version", "setting", "algorithm", "task")},
            "tables": {stem: {"metadata": _metadata(table), "columns": table.column_names,
                              "rows": [_finite(row) for row in table.to_pylist()]}
                       for stem, table in sorted(tables.items())}}


def structure_json(manifest: dict, tables: dict[str, pa.Table]) -> bytes:
    """`structure_document` as UTF-8 JSON (strict: no NaN tokens)."""
    return json.dumps(structure_document(manifest, tables), allow_nan=False, indent=1).encode()


def _metadata(table: pa.Table) -> dict[str, Any]:
    """The table's schema metadata, each value parsed as JSON where it is JSON (else the text)."""
    decoded: dict[str, Any] = {}
    for key, value in (table.schema.metadata or {}).items():
        text = value.decode()
        try:
            decoded[key.decode()] = json.loads(text)
        except json.JSONDecodeError:
            decoded[key.decode()] = text
    return decoded


def _finite(value: Any) -> Any:
    """`value` with every NaN float, at any depth of lists and dicts, replaced by None."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value
