"""Shared fixtures: small synthetic tables with numeric, categorical and missing values."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from tests.postgres import database, postgres  # noqa: F401 - the throwaway PostgreSQL server's fixtures


def mixed_table(n_rows: int = 600, seed: int = 0, task: str = "classification",
                n_classes: int = 3) -> pd.DataFrame:
    """A table with numeric, integer, string-categorical and pandas-categorical columns and NaNs."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({f"num{i}": rng.normal(size=n_rows) for i in range(8)})
    frame["int0"] = rng.integers(0, 5, n_rows)
    frame["cat_str"] = rng.choice(["crimson", "emerald", "azure", "onyx"], n_rows).astype(object)
    frame["cat_pd"] = pd.Categorical(rng.choice(["a", "b", "c"], n_rows))
    frame["flag"] = rng.random(n_rows) < 0.3
    for column in ("num0", "num3", "cat_str"):
        frame.loc[rng.random(n_rows) < 0.1, column] = np.nan
    signal = (
        frame["num1"].to_numpy()
        + 0.8 * np.nan_to_num(frame["num0"].to_numpy())
        + (frame["cat_str"] == "crimson").to_numpy() * 1.5
        - (frame["cat_pd"] == "b").to_numpy() * 1.0
        + 0.3 * frame["int0"].to_numpy()
    )
    if task == "regression":
        frame["target"] = signal + rng.normal(scale=0.3, size=n_rows)
    else:
        cuts = np.quantile(signal, np.linspace(0, 1, n_classes + 1)[1:-1])
        frame["target"] = np.array([f"class_{k}" for k in np.digitize(signal, cuts)], dtype=object)
    return frame


@pytest.fixture
def classification_table() -> pd.DataFrame:
    return mixed_table(task="classification")


@pytest.fixture
def regression_table() -> pd.DataFrame:
    return mixed_table(task="regression")


def any_table(n_rows: int = 240, seed: int = 0) -> pd.DataFrame:
    """A table as people have them.

    A string id, numbers, strings and booleans with missing values, a boolean, a date and a timezone-aware
    datetime (both with missing values), a class label `y` and a numeric label `amount`.
    """
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "customer_id": [f"C{i:05d}" for i in range(n_rows)],
        "age": rng.integers(18, 80, n_rows).astype(np.float64),
        "plan": rng.choice(["basic", "plus", "pro"], n_rows).astype(object),
        "member": rng.random(n_rows) < 0.4,
        "newsletter": pd.Series(rng.random(n_rows) < 0.5, dtype=object),
        "signup": pd.Timestamp("2019-01-01") + pd.to_timedelta(rng.integers(0, 1500, n_rows), unit="D"),
        "last_seen": (pd.Timestamp("2023-01-01 08:00", tz="Europe/Paris")
                      + pd.to_timedelta(rng.integers(0, 10**7, n_rows), unit="s")),
    })
    frame.loc[rng.random(n_rows) < 0.1, "age"] = np.nan
    frame.loc[rng.random(n_rows) < 0.1, "plan"] = None
    frame.loc[rng.random(n_rows) < 0.1, "newsletter"] = None
    frame.loc[rng.random(n_rows) < 0.05, "signup"] = pd.NaT
    frame.loc[rng.random(n_rows) < 0.05, "last_seen"] = pd.NaT
    recent = (frame["signup"] > pd.Timestamp("2021-01-01")).to_numpy()
    frame["y"] = np.where((frame["plan"] == "pro").to_numpy() | recent, "churn", "stay").astype(object)
    frame["amount"] = (np.nan_to_num(frame["age"].to_numpy(), nan=40.0) + 20.0 * recent
                       + 0.25 * rng.integers(0, 8, n_rows))
    return frame


def write_any_table(folder, n_rows: int = 240, seed: int = 0) -> tuple:
    """`any_table` as a Parquet file (timestamp columns) and a CSV file (the same dates as ISO strings)."""
    frame = any_table(n_rows, seed)
    parquet, csv = folder / "any.parquet", folder / "any.csv"
    frame.to_parquet(parquet)
    frame.to_csv(csv, index=False)
    return csv, parquet


# -- CPU time per test (issue #34) -------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    """`--cpu-durations=N`: as `--durations`, but the CPU time this process spent (all its threads)."""
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="list the N test phases that took the most CPU time of this process, all its "
                          "threads (Dask's in-process workers, numba's) included, child processes not: on a "
                          "shared machine wall times move with the neighbours, CPU time much less (with "
                          "-n 0: pytest-xdist's workers keep their own lists)")


_CPU: list[tuple[float, str, str]] = []
"""(CPU seconds, phase, test id) of every test phase, when --cpu-durations is given."""


def _cpu_timed(phase: str):
    @pytest.hookimpl(wrapper=True)
    def hook(item: pytest.Item):
        if item.config.getoption("cpu_durations") is None:
            return (yield)
        start = time.process_time()
        try:
            return (yield)
        finally:
            _CPU.append((time.process_time() - start, phase, item.nodeid))
    return hook


pytest_runtest_setup = _cpu_timed("setup")
pytest_runtest_call = _cpu_timed("call")
pytest_runtest_teardown = _cpu_timed("teardown")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The slowest test phases by CPU time, and the total (with --cpu-durations)."""
    count = config.getoption("cpu_durations")
    if count is None or not _CPU:
        return
    ranked, total = sorted(_CPU, reverse=True), sum(seconds for seconds, _, _ in _CPU)
    terminalreporter.write_sep("=", f"slowest {count or 'all'} CPU durations (total {total:.1f} s)")
    for seconds, phase, nodeid in ranked[:count or None]:
        terminalreporter.write_line(f"{seconds:8.2f}s {phase:<8} {nodeid}")
