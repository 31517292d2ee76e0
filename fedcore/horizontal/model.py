"""The complete horizontal forest: every tree's structure, split features and thresholds, and leaf values.

Unlike the vertical setting, every institution (and the master) ends up holding the whole model, so
prediction is local and needs no protocol. Arrays are aligned and sorted by (tree, node); node ids are per
tree, breadth-first from root 0 and contiguous, so a node's row is `tree_offsets[tree] + node`.

A split sends a row left when `x[feature] <= threshold`; NaN (missing, or a category outside the agreed
list) compares false and goes right. `value` holds class probabilities (classification, columns in class
order) or the mean target (regression, one column) of every node, leaves and internal nodes alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa

from fedcore.algorithms import EXTRA_TREES, read_algorithm
from fedcore.errors import ArtifactError
from fedcore.estimator_api import impurity_importances, node_impurity_decrease
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.trees.combination import MEAN, TreeCombination

NO_CHILD = -1
MODEL_TABLE = "model"
"""The name of the table a registered horizontal version stores its forest in."""
SCHEMA_KEY = b"fedforest.horizontal.schema"
META_KEY = b"fedforest.horizontal.meta"
_ROW_CHUNK = 1 << 14

_INT_FIELDS = {"tree": np.int32, "node": np.int32, "left": np.int32, "right": np.int32, "depth": np.int16,
               "feature": np.int32}
MODEL_INT_FIELDS = tuple(_INT_FIELDS)
"""The integer node arrays of a forest (and of the master's `model` message); the others are floats."""
_ARROW_TYPES = {np.int32: pa.int32(), np.int16: pa.int16()}


@dataclass
class HorizontalForest:
    """A complete extra-trees forest (see module doc)."""

    tree: np.ndarray
    node: np.ndarray
    left: np.ndarray
    right: np.ndarray
    depth: np.ndarray
    feature: np.ndarray  # global feature index (schema order); -1 on leaves
    threshold: np.ndarray  # float64; NaN on leaves
    weight: np.ndarray  # float64: the node's (aggregated, possibly noisy) sample count
    value: np.ndarray  # (n_nodes, n_outputs) float64
    n_trees: int
    task: str = "classification"
    algorithm: str = EXTRA_TREES.id
    schema: HorizontalSchema | None = None
    combination: TreeCombination = MEAN
    """How the trees combine: the forests' mean, or boosting's base score plus leaf weights through a link."""

    @property
    def n_nodes(self) -> int:
        """Total number of nodes over all trees."""
        return len(self.tree)

    def tree_offsets(self) -> np.ndarray:
        """Row of each tree's root (length n_trees + 1)."""
        return np.searchsorted(self.tree, np.arange(self.n_trees + 1)).astype(np.int64)

    def max_depth(self) -> int:
        """Depth of the deepest node."""
        return int(self.depth.max()) if self.n_nodes else 0

    def importances(self, criterion: str, n_features: int) -> np.ndarray:
        """Impurity importances over the schema's features, summing to 1 (scikit-learn's definition).

        From the nodes' weights and values: exact when those are (privacy "none", PPD-ERT secagg), an
        estimate from the released noisy ones under "gdp", "ldp" and "secagg-dp". Every institution holds
        the whole forest, so every one computes this same vector.
        """
        decrease = node_impurity_decrease(self.tree, self.left, self.right, self.weight, self.value,
                                          criterion, self.n_trees)
        return impurity_importances(decrease, self.tree, self.n_trees, self.feature, n_features)

    def arrays(self) -> dict[str, np.ndarray]:
        """The node arrays by name (what the master sends in the final `model` message)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if isinstance(getattr(self, f.name), np.ndarray)}

    def same_as(self, other: HorizontalForest) -> bool:
        """Node for node the same forest: structure, features, thresholds, weights and values (NaN = NaN)."""
        mine, theirs = self.arrays(), other.arrays()
        return self.n_trees == other.n_trees and mine.keys() == theirs.keys() and all(
            value.shape == theirs[name].shape and np.array_equal(value, theirs[name],
                                                                 equal_nan=value.dtype.kind == "f")
            for name, value in mine.items())

    # -- prediction ------------------------------------------------------------------------------
    def apply(self, X: np.ndarray) -> np.ndarray:
        """Row index (into the node arrays) of the leaf each row reaches in each tree: (n_rows, n_trees)."""
        X = np.asarray(X, dtype=np.float64)
        offsets = self.tree_offsets()
        out = np.empty((X.shape[0], self.n_trees), dtype=np.int64)
        for start in range(0, X.shape[0], _ROW_CHUNK):
            rows = np.arange(start, min(start + _ROW_CHUNK, X.shape[0]))
            current = np.broadcast_to(offsets[:-1], (len(rows), self.n_trees)).copy()
            base = current.copy()
            row_index = np.broadcast_to(rows[:, None], current.shape)
            while True:
                feature = self.feature[current]
                internal = feature >= 0
                if not internal.any():
                    break
                values = X[row_index[internal], feature[internal]]
                cur = current[internal]
                go_left = values <= self.threshold[cur]  # NaN -> False -> right
                current[internal] = base[internal] + np.where(go_left, self.left[cur], self.right[cur])
            out[rows] = current
        return out

    def predict_values(self, X: np.ndarray) -> np.ndarray:
        """The trees' leaf values combined (`combination`: a forest's mean), (n_rows, n_outputs)."""
        leaves = self.apply(X)
        return self.combination.combine(self.value[leaves])

    # -- Arrow ------------------------------------------------------------------------------------
    def to_table(self) -> pa.Table:
        """The forest as an Arrow table; the schema and counts ride in the table metadata."""
        columns = {}
        for name, dtype in _INT_FIELDS.items():
            columns[name] = pa.array(np.asarray(getattr(self, name), dtype=dtype), _ARROW_TYPES[dtype])
        columns["threshold"] = pa.array(np.asarray(self.threshold, np.float64), pa.float64(),
                                        from_pandas=False)
        columns["weight"] = pa.array(np.asarray(self.weight, np.float64), pa.float64())
        value = np.ascontiguousarray(self.value, dtype=np.float64)
        columns["value"] = pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1)), value.shape[1])
        meta: dict = {"n_trees": self.n_trees, "task": self.task, "algorithm": self.algorithm}
        if self.combination != MEAN:  # forests' tables stay as they were
            c = self.combination
            meta["combination"] = {"kind": c.kind, "base_score": list(c.base_score), "link": c.link}
        metadata = {META_KEY: json.dumps(meta).encode()}
        if self.schema is not None:
            metadata[SCHEMA_KEY] = json.dumps(self.schema.to_dict()).encode()
        return pa.table(columns, metadata=metadata)

    @classmethod
    def from_table(cls, table: pa.Table) -> HorizontalForest:
        """Rebuild a forest written by `to_table` (exact, field by field)."""
        metadata = table.schema.metadata or {}
        if META_KEY not in metadata:
            raise ArtifactError("not a horizontal forest table: metadata key fedforest.horizontal.meta is "
                                "missing")
        meta = json.loads(metadata[META_KEY])
        schema = (HorizontalSchema.from_dict(json.loads(metadata[SCHEMA_KEY])) if SCHEMA_KEY in metadata
                  else None)
        missing = [c for c in (*_INT_FIELDS, "threshold", "weight", "value") if c not in table.column_names]
        if missing:
            raise ArtifactError(f"horizontal forest table lacks columns {missing}")
        arrays = {name: table.column(name).to_numpy().astype(dtype) for name, dtype in _INT_FIELDS.items()}
        value_column = table.column("value").combine_chunks()
        width = value_column.type.list_size
        value = value_column.values.to_numpy(zero_copy_only=False).reshape(table.num_rows, width)
        return cls(**arrays, threshold=table.column("threshold").to_numpy().astype(np.float64),
                   weight=table.column("weight").to_numpy().astype(np.float64),
                   value=value.astype(np.float64), n_trees=int(meta["n_trees"]), task=meta["task"],
                   algorithm=read_algorithm(meta["algorithm"]).id, schema=schema,
                   combination=combination_of(meta.get("combination")))

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], n_trees: int, task: str, algorithm: str,
                    schema: HorizontalSchema | None = None,
                    combination: TreeCombination = MEAN) -> HorizontalForest:
        """Rebuild from `arrays()` output (as received in a `model` message)."""
        kwargs = {name: np.asarray(arrays[name]).astype(dtype, copy=False)  # no copy when it is dtype
                  for name, dtype in _INT_FIELDS.items()}
        value = np.asarray(arrays["value"], dtype=np.float64)
        if value.ndim == 1:
            value = value[:, None]
        return cls(**kwargs, threshold=np.asarray(arrays["threshold"], np.float64),
                   weight=np.asarray(arrays["weight"], np.float64), value=value,
                   n_trees=int(n_trees), task=task, algorithm=algorithm, schema=schema,
                   combination=combination)


def combination_of(fields: dict | None) -> TreeCombination:
    """The combination a table's metadata or a model message states (none: the forests' mean)."""
    if not fields:
        return MEAN
    try:
        return TreeCombination(str(fields["kind"]), tuple(float(v) for v in fields["base_score"]),
                               str(fields["link"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ArtifactError(f"a horizontal model states an unusable combination {fields!r}: "
                            f"{error}") from None
