"""The column schema every institution of a horizontal federation shares.

Names, kinds, category lists, classes (classification) and the label.

In the horizontal setting all parties hold the same columns, so a feature is known on the wire only by its
index into this agreed schema (names never cross). The schema comes from the data contracts in a real
deployment; the simulation estimators derive it from the party frames (see `validation.build_schema`).

Encoding (`HorizontalSchema.encode`) turns a party's frame into the float64 matrix the engine reads:
numbers as they are (booleans as 0/1), categorical columns as the integer code of the value in the agreed
category list, and missing values (and categories outside the list) as NaN. A split tests `x <= threshold`;
NaN compares false, so **missing values always go right**.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedcore.data.binning import category_strings
from fedcore.data.numbers import numeric_values
from fedcore.errors import ColumnNotFoundError, InputError, LabelError, MalformedMessage
from fedcore.protocol.messages import Header

NUMERIC = "numeric"
CATEGORICAL = "categorical"


@dataclass(frozen=True)
class ColumnSpec:
    """One feature column: its name, kind and (categorical) agreed category list, as strings."""

    name: str
    kind: str
    categories: tuple[str, ...] | None = None

    @property
    def is_categorical(self) -> bool:
        """True for categorical columns (thresholds are over category codes)."""
        return self.kind == CATEGORICAL

    @property
    def category_list(self) -> tuple[str, ...]:
        """The agreed categories of a categorical column (InputError for a column without them)."""
        if self.categories is None:
            raise InputError(f"column {self.name!r} has no agreed category list")
        return self.categories


@dataclass(frozen=True)
class HorizontalSchema:
    """The agreed schema of a horizontal federation."""

    columns: tuple[ColumnSpec, ...]
    label: str
    task: str  # "classification" | "regression"
    classes: tuple | None = None  # classification: the class labels, sorted; code k is classes[k]

    @property
    def names(self) -> list[str]:
        """Feature column names in schema order (global feature index = position)."""
        return [c.name for c in self.columns]

    @property
    def n_features(self) -> int:
        """Number of feature columns."""
        return len(self.columns)

    @property
    def n_classes(self) -> int:
        """Number of classes (0 for regression)."""
        return len(self.classes) if self.classes is not None else 0

    @property
    def is_categorical(self) -> np.ndarray:
        """Boolean mask of categorical columns."""
        return np.array([c.is_categorical for c in self.columns], dtype=bool)

    def to_dict(self) -> dict:
        """JSON-ready form (for artifacts and the fingerprint)."""
        return {
            "label": self.label,
            "task": self.task,
            "classes": None if self.classes is None else [_json_scalar(c) for c in self.classes],
            "columns": [{"name": c.name, "kind": c.kind,
                         "categories": None if c.categories is None else list(c.categories)}
                        for c in self.columns],
        }

    @classmethod
    def from_dict(cls, data: dict) -> HorizontalSchema:
        """Inverse of `to_dict`."""
        columns = tuple(ColumnSpec(c["name"], c["kind"],
                                   None if c["categories"] is None else tuple(c["categories"]))
                        for c in data["columns"])
        classes = None if data.get("classes") is None else tuple(data["classes"])
        return cls(columns=columns, label=data["label"], task=data["task"], classes=classes)

    @classmethod
    def received(cls, header: Header) -> HorizontalSchema:
        """The schema a master's setup names in its header field 'schema' (MalformedMessage if unreadable)."""
        try:
            return cls.from_dict(header["schema"])
        except (KeyError, TypeError, AttributeError) as error:
            raise MalformedMessage("header field 'schema' must be a table schema (columns with name, kind "
                                   "and categories; label, task, classes)") from error

    def fingerprint(self) -> str:
        """SHA-256 of the canonical JSON form: parties and master check they agree before training."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def feature_domains(self) -> tuple[np.ndarray, np.ndarray]:
        """Code domains of categorical columns (0, n_categories - 1); NaN for numeric columns."""
        low = np.full(self.n_features, np.nan)
        high = np.full(self.n_features, np.nan)
        for j, c in enumerate(self.columns):
            if c.is_categorical:
                low[j], high[j] = 0.0, float(max(len(c.category_list) - 1, 0))
        return low, high

    # -- encoding (party side) -------------------------------------------------------------------
    def encode(self, frame: pd.DataFrame) -> np.ndarray:
        """The frame's feature columns as a C-ordered float64 (n_rows, n_features) matrix (see module doc)."""
        missing = [c.name for c in self.columns if c.name not in frame.columns]
        if missing:
            raise ColumnNotFoundError(f"the frame lacks the schema's feature columns {missing}; "
                                      "every institution must hold every feature column")
        X = np.empty((len(frame), self.n_features), dtype=np.float64)
        for j, column in enumerate(self.columns):
            series = frame[column.name]
            if column.is_categorical:
                # na_value=None is valid pandas; pandas-stubs do not list it
                values = category_strings(series).to_numpy(  # type: ignore[call-overload]  # pandas-stubs gap
                    dtype=object, na_value=None)
                categories = pd.Index(list(column.category_list), dtype=object)
                codes = categories.get_indexer(values)  # unknown, missing: -1
                X[:, j] = np.where(codes < 0, np.nan, codes.astype(np.float64))
            else:
                X[:, j] = numeric_values(series)
        return X

    def decode(self, X: np.ndarray) -> pd.DataFrame:
        """Encoded features back as a frame: numbers, and categories as their strings (else None).

        What a party's drift snapshot is made from, in process or from its encoded blocks on Dask workers.
        """
        columns: dict[str, pd.Series] = {}
        for j, column in enumerate(self.columns):
            if column.is_categorical:
                names = np.array(list(column.category_list), dtype=object)
                present = ~np.isnan(X[:, j])
                values = np.full(len(X), None, dtype=object)
                values[present] = names[X[present, j].astype(np.int64)]
                columns[column.name] = pd.Series(values, dtype=object)
            else:
                columns[column.name] = pd.Series(X[:, j], dtype=np.float64)
        return pd.DataFrame(columns, index=pd.RangeIndex(len(X)))

    def encode_labels(self, series: pd.Series) -> np.ndarray:
        """Class codes (int64) for classification, float64 targets for regression."""
        if self.task == "regression":
            return numeric_values(series, "label")
        if self.classes is None:
            raise LabelError(f"label {self.label!r}: a classification schema needs the agreed classes")
        codes = pd.Index(list(self.classes)).get_indexer(series.to_numpy())
        if np.any(codes < 0):
            # counts, never the values: this text may travel to the master
            rows, distinct = int(np.count_nonzero(codes < 0)), int(series[codes < 0].nunique(dropna=False))
            raise LabelError(f"label {self.label!r}: {rows} rows hold {distinct} distinct values outside the "
                             f"agreed classes {list(self.classes)}")
        return codes.astype(np.int64)


def _json_scalar(value):
    """A class label as a JSON scalar (numpy scalars become Python scalars)."""
    return value.item() if isinstance(value, np.generic) else value
