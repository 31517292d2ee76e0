"""Arrow tables of the tree tables: the master's forest structure and a party's partial forest.

The master's table has no feature or threshold columns (it never learns them). A party's table names its
own columns only on the nodes it owns and stores categorical splits as category strings, so a partial
model stays readable without the party's binner; the column vocabulary rides in the schema metadata.
Both conversions are exact: reading a written table gives back arrays equal field by field.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedcore.errors import ArtifactError
from fedcore.trees.combination import MEAN, TreeCombination
from fedcore.trees.structure import ForestStructure, PartialForest

COLUMNS_KEY = b"fedforest.columns"
N_TREES_KEY = b"fedforest.n_trees"
COMBINATION_KEY = b"fedforest.combination"
"""How the trees combine, in a boosting model's master table: {"kind": "sum", "base_score": [...],
"link": ...}
(absent: a forest's mean)."""
N_CAT_WORDS = 4  # cat_bits words per node: 256 category codes

_INDEX_FIELDS = (("tree", pa.int32()), ("node", pa.int32()), ("left", pa.int32()), ("right", pa.int32()))


# -- master -----------------------------------------------------------------------------------------
def master_table(structure: ForestStructure, combination: TreeCombination = MEAN) -> pa.Table:
    """The master's forest as an Arrow table: structure, owner party index and node values, nothing else.

    A boosting model's combination rule (sum plus link, base score) rides in the schema metadata.
    """
    s = structure
    value = np.ascontiguousarray(s.value, dtype=np.float64)
    columns = {name: pa.array(getattr(s, name), type) for name, type in _INDEX_FIELDS}
    columns["depth"] = pa.array(s.depth, pa.int16())
    columns["owner"] = pa.array(s.owner, pa.int16())
    columns["weight"] = pa.array(s.weight, pa.float64())
    columns["value"] = pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1)), value.shape[1])
    metadata = {N_TREES_KEY: str(s.n_trees).encode()}
    if combination != MEAN:
        metadata[COMBINATION_KEY] = json.dumps({"kind": combination.kind, "link": combination.link,
                                                "base_score": list(combination.base_score)}).encode()
    return pa.table(columns, metadata=metadata)


def combination_from_table(table: pa.Table) -> TreeCombination:
    """How a master table's trees combine: its stored rule, else a forest's mean."""
    raw = (table.schema.metadata or {}).get(COMBINATION_KEY)
    if raw is None:
        return MEAN
    try:
        rule = json.loads(raw)
        return TreeCombination(str(rule["kind"]), tuple(float(b) for b in rule["base_score"]),
                               str(rule["link"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"master table: malformed combination rule in its metadata ({exc})") from exc


def structure_from_table(table: pa.Table, n_trees: int) -> ForestStructure:
    """Rebuild the master's ForestStructure from `master_table` output."""
    arrays = {name: _numpy(table, name, np.dtype(type.to_pandas_dtype())) for name, type in _INDEX_FIELDS}
    return ForestStructure(
        **arrays,
        depth=_numpy(table, "depth", np.dtype(np.int16)),
        owner=_numpy(table, "owner", np.dtype(np.int16)),
        weight=_numpy(table, "weight", np.dtype(np.float64)),
        value=_value_matrix(_column(table, "value"), table.num_rows),
        n_trees=int(n_trees),
    )


def _value_matrix(column: pa.Array, n_rows: int) -> np.ndarray:
    """Node values as an (n_nodes, n_outputs) float64 matrix from a fixed-size or variable list column."""
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
    elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if len(lengths) and np.any(lengths != lengths[0]):
            raise ArtifactError("master table: column 'value' has rows of different lengths")
        width = int(lengths[0]) if len(lengths) else 0
    else:
        raise ArtifactError(f"master table: column 'value' should be a list of float64, found {column.type}")
    flat = column.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
    return flat.reshape(n_rows, width).copy()


# -- party ------------------------------------------------------------------------------------------
def party_table(model: PartialForest) -> pa.Table:
    """A party's partial forest as an Arrow table: column names and thresholds only on its own nodes."""
    owned = model.feature >= 0
    numeric = owned & ~model.is_categorical
    names = np.array(model.column_names + [None], dtype=object)
    columns = {name: pa.array(getattr(model, name), type) for name, type in _INDEX_FIELDS}
    columns["feature"] = pa.array(names[np.where(owned, model.feature, len(model.column_names))], pa.string())
    columns["threshold"] = pa.array(model.threshold.astype(np.float64), pa.float64(), mask=~numeric)
    columns["missing_left"] = pa.array(model.missing_left.astype(np.bool_), pa.bool_(), mask=~owned)
    columns["categories_left"] = _categories_left(model)
    vocabulary = [{"name": n, "categories": c}
                  for n, c in zip(model.column_names, model.column_categories, strict=True)]
    metadata = {COLUMNS_KEY: json.dumps(vocabulary).encode(), N_TREES_KEY: str(model.n_trees).encode()}
    return pa.table(columns, metadata=metadata)


def partial_forest_from_table(table: pa.Table) -> PartialForest:
    """Rebuild a party's PartialForest from `party_table` output (cat_bits from the category strings)."""
    names, categories = _vocabulary(table)
    n = table.num_rows
    feature = _feature_indices(_column(table, "feature"), names)
    categories_column = _column(table, "categories_left")
    is_categorical = categories_column.is_valid().to_numpy(zero_copy_only=False).astype(np.bool_)
    if np.any(is_categorical & (feature < 0)):
        raise ArtifactError("party table: a categorical split on a node without a feature")
    threshold = _column(table, "threshold").to_numpy(zero_copy_only=False).astype(np.float64)
    missing_left = (_column(table, "missing_left").fill_null(False).to_numpy(zero_copy_only=False)
                    .astype(np.bool_))
    return PartialForest(
        **{name: _numpy(table, name, np.dtype(type.to_pandas_dtype())) for name, type in _INDEX_FIELDS},
        feature=feature,
        threshold=threshold,
        missing_left=missing_left,
        is_categorical=is_categorical,
        cat_bits=_cat_bits(categories_column, feature, categories, n),
        n_trees=_n_trees(table),
        column_names=names,
        column_categories=categories,
    )


def _categories_left(model: PartialForest) -> pa.Array:
    """Per node, the category strings sent left.

    Null unless the node is one of this party's categorical splits.
    """
    n = len(model.tree)
    is_cat = (model.feature >= 0) & model.is_categorical
    cat_rows = np.flatnonzero(is_cat)
    bits = np.unpackbits(np.ascontiguousarray(model.cat_bits[cat_rows], dtype="<u8").view(np.uint8)
                         .reshape(len(cat_rows), 8 * N_CAT_WORDS), axis=1, bitorder="little")
    row, code = np.nonzero(bits)
    column = model.feature[cat_rows][row]
    flat_vocab, base, size = _flat_vocabulary(model.column_categories)
    if np.any(code >= size[column]):
        bad = int(cat_rows[row[np.argmax(code >= size[column])]])
        raise ArtifactError(f"partial forest node {bad}: a category bit lies outside column "
                            f"{model.column_names[model.feature[bad]]!r}'s vocabulary")
    counts = np.zeros(n, np.int64)
    counts[cat_rows] = np.bincount(row, minlength=len(cat_rows))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    values = pa.array(flat_vocab[base[column] + code], pa.string())
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(pa.string()), mask=pa.array(~is_cat))


def _cat_bits(column: pa.Array, feature: np.ndarray, categories: list[list[str] | None],
              n: int) -> np.ndarray:
    """Rebuild the (n, 4) uint64 category bitsets from the category strings and the vocabulary."""
    bits = np.zeros((n, N_CAT_WORDS), np.uint64)
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    row = np.repeat(np.arange(n), lengths)
    values = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=object)
    code = np.full(len(values), -1, np.int64)
    col_of_value = feature[row]
    for col in np.unique(col_of_value):
        vocab = categories[col]
        if vocab is None:
            raise ArtifactError(f"party table: numeric column #{col} has a categorical split")
        where = col_of_value == col
        lookup = {c: i for i, c in enumerate(vocab)}
        code[where] = [lookup.get(v, -1) for v in values[where]]
    if np.any(code < 0):
        bad = values[np.argmax(code < 0)]
        raise ArtifactError(f"party table: category {bad!r} is not in its column's vocabulary")
    np.bitwise_or.at(bits, (row, code >> 6), np.left_shift(np.uint64(1), (code & 63).astype(np.uint64)))
    return bits


def _flat_vocabulary(categories: list[list[str] | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All columns' categories in one array, each column's start in it and its vocabulary size."""
    sizes = np.array([len(c) if c is not None else 0 for c in categories], np.int64)
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else sizes
    flat = np.array([v for c in categories if c is not None for v in c] + [None], dtype=object)[:-1]
    return flat, base, sizes


def _feature_indices(column: pa.Array, names: list[str]) -> np.ndarray:
    """Local column index of each node's feature name, -1 where null (not owned)."""
    index = pc.index_in(column, value_set=pa.array(names, pa.string()))
    unknown = pc.and_(column.is_valid(), index.is_null())
    if pc.any(unknown).as_py():
        bad = column.filter(unknown)[0].as_py()
        raise ArtifactError(f"party table: feature {bad!r} is not one of the party's columns {names}")
    return index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)


def _vocabulary(table: pa.Table) -> tuple[list[str], list[list[str] | None]]:
    """Column names and categorical vocabularies from the schema metadata."""
    raw = (table.schema.metadata or {}).get(COLUMNS_KEY)
    if raw is None:
        raise ArtifactError("party table: schema metadata 'fedforest.columns' is missing")
    entries = json.loads(raw)
    return [str(e["name"]) for e in entries], [None if e["categories"] is None else list(e["categories"])
                                               for e in entries]


def _n_trees(table: pa.Table) -> int:
    """Number of trees, from the schema metadata."""
    raw = (table.schema.metadata or {}).get(N_TREES_KEY)
    if raw is None:
        raise ArtifactError("table: schema metadata 'fedforest.n_trees' is missing")
    return int(raw)


def _column(table: pa.Table, name: str) -> pa.Array:
    """One column as a single Arrow array, or ArtifactError naming the missing column."""
    if name not in table.column_names:
        raise ArtifactError(f"table lacks column {name!r} (found {table.column_names})")
    return table.column(name).combine_chunks()


def _numpy(table: pa.Table, name: str, dtype: np.dtype) -> np.ndarray:
    """A non-null column as a writable NumPy array of `dtype`."""
    column = _column(table, name)
    if column.null_count:
        raise ArtifactError(f"table column {name!r} has {column.null_count} nulls; expected none")
    return np.array(column.to_numpy(zero_copy_only=False), dtype=dtype)
