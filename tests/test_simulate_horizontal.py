"""The horizontal simulator's stand-ins for the data contracts.

Category lists and numeric domains read off the pooled table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcore.simulation import declared_ranges, pooled_categories


def test_pooled_categories_lists_every_categorical_feature() -> None:
    table = pd.DataFrame({
        "plan": ["pro", None, "basic", "pro"],
        "flag": pd.Series([True, None, False, True], dtype=object),
        "level": pd.Categorical(["b", "a", "b", "a"], categories=["b", "a", "unused"]),
        "member": [True, False, True, False],
        "x": [1.0, np.nan, 2.0, 3.0],
        "y": ["no", "yes", "no", "yes"],
    })
    assert pooled_categories(table, "y") == {"plan": ["basic", "pro"], "flag": ["False", "True"],
                                             # a Categorical keeps its own list
                                             "level": ["b", "a", "unused"]}


def test_declared_ranges_cover_numbers_booleans_and_missing_values() -> None:
    table = pd.DataFrame({"x": [1.5, np.nan, -2.0], "member": [True, False, True], "empty": [np.nan] * 3,
                          "plan": ["a", "b", "a"], "y": [0, 1, 0]})
    assert declared_ranges(table, "y") == {"x": (-2.0, 1.5), "member": (0.0, 1.0), "empty": (0.0, 0.0)}
