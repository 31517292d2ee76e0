"""Helpers of the horizontal tests: tables with NaNs and categoricals, row splits into parties."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.conftest import mixed_table

CAT_STR = ["azure", "crimson", "emerald", "onyx"]


def horizontal_table(seed: int = 0, task: str = "classification", n_rows: int = 600,
                     n_classes: int = 3) -> pd.DataFrame:
    """The shared mixed table (numeric, integer, boolean, two categoricals, NaNs).

    cat_str is a pandas Categorical so every party slice carries the same category list.
    """
    table = mixed_table(n_rows=n_rows, seed=seed, task=task, n_classes=n_classes)
    table["cat_str"] = pd.Categorical(table["cat_str"], categories=CAT_STR)
    return table


def split_rows(table: pd.DataFrame, n_parties: int, seed: int = 0, uneven: bool = True) -> list[pd.DataFrame]:
    """Deal the rows (shuffled) to n_parties parties, in uneven shares."""
    order = np.random.default_rng(seed).permutation(len(table))
    if uneven and n_parties > 1:
        weights = np.arange(1, n_parties + 1, dtype=float)
        cuts = (np.cumsum(weights)[:-1] / weights.sum() * len(table)).astype(int)
        parts = np.split(order, cuts)
    else:
        parts = np.array_split(order, n_parties)
    return [table.iloc[np.sort(p)].reset_index(drop=True) for p in parts]


def assert_same_forest(a, b) -> None:
    """Node for node: structure, features, thresholds, weights and values identical."""
    assert a.n_trees == b.n_trees
    arrays_a, arrays_b = a.arrays(), b.arrays()
    assert arrays_a.keys() == arrays_b.keys()
    for name, value in arrays_a.items():
        np.testing.assert_array_equal(value, arrays_b[name], err_msg=name)


def announce_parties(session, announced: int) -> None:
    """Make `session`'s master lie in every `hello` it sends: it announces `announced` parties."""
    from fedcore.protocol.messages import Message

    honest = session.transport.exchange

    def lying(messages):
        return honest({name: Message(m.kind, {**m.header, "n_parties": announced}, m.arrays)
                       if m.kind == "hello" else m for name, m in messages.items()})

    session.transport.exchange = lying


def rewrite_domains(session, feature: str, low: float, high: float) -> None:
    """Make `session`'s master send the domain [`low`, `high`] for `feature` in its `setup` header."""
    from fedcore.protocol.messages import Message

    honest = session.transport.exchange

    def lying(messages):
        rewritten = {}
        for name, m in messages.items():
            if m.kind == "setup":
                j = session.schema.names.index(feature)
                lows, highs = list(m.header["low"]), list(m.header["high"])
                lows[j], highs[j] = low, high
                m = Message(m.kind, {**m.header, "low": lows, "high": highs}, m.arrays)
            rewritten[name] = m
        return honest(rewritten)

    session.transport.exchange = lying


DOMAIN_LIES = [  # (feature, low, high) -> why the institution refuses, after "the master's domain for ..."
    ("x3", float("nan"), 5.0, r"is \[nan, 5\.0\]; a domain is two finite numbers, low <= high"),
    ("x3", 4.0, -4.0, r"is \[4\.0, -4\.0\]; a domain is two finite numbers, low <= high"),
    ("x3", float("-inf"), 5.0, r"is \[-inf, 5\.0\]; a domain is two finite numbers, low <= high"),
    ("x3", 0.0, 0.5, r"is \[0\.0, 0\.5\], which does not hold the range \[-?[0-9.]+, [0-9.]+\] its data "
                     r"contract declares"),
]
