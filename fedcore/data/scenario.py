"""A synthetic vertical demo: a bank, an e-commerce company and an insurer share some customers.

`make_vertical_scenario(out_dir)` writes, per institution, ``<inst>/train.parquet`` (training customers)
and ``<inst>/new.parquet`` (a fresh batch of customers to score), each keyed by ``customer_id`` strings
("C000123"), with rows shuffled per institution and partially overlapping customer sets: of 6000
customers the bank holds 5000, the e-commerce company 4500 and the insurer 4000, and exactly half
(3000) are customers of all three. The bank is the label holder: ``responded`` ("yes"/"no") to an
offer. The response depends on features of all three institutions, so a federated model beats one
trained on the bank's columns alone.

``truth/train.parquet`` and ``truth/new.parquet`` pool everything (every customer, all columns with
missing values where an institution does not hold the customer, membership flags, and the true
``responded`` for every customer). They are DEMO-ONLY ground truth for computing a centralized reference
and scoring the new batch; no real federation has such a table.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from fedcore.errors import ParameterError

ID_COLUMN = "customer_id"
LABEL = "responded"
LABEL_HOLDER = "bank"
# Share of all customers each institution holds; CORE_SHARE of all customers are at every institution.
SHARES = {"bank": 5 / 6, "ecommerce": 0.75, "insurer": 2 / 3}
CORE_SHARE = 0.5
COLUMNS = {
    "bank": ["age", "income", "balance", "tenure_years", "n_products", "segment", "region", "has_mortgage"],
    "ecommerce": ["orders_12m", "avg_basket", "days_since_last_order", "preferred_channel", "returns_rate",
                  "newsletter"],
    "insurer": ["policies", "claims_3y", "premium", "vehicle_type", "risk_class"],
}


CONTRACT_BOUNDS = {
    "age": (18, 100), "income": (0.0, 300_000.0), "balance": (-100_000.0, 900_000.0),
    "tenure_years": (0.0, 70.0), "n_products": (0, 9), "orders_12m": (0, 80), "avg_basket": (0.0, 300.0),
    "days_since_last_order": (0.0, 500.0), "returns_rate": (0.0, 0.7), "policies": (0, 7),
    "claims_3y": (0, 7), "premium": (0.0, 3000.0),
}
"""The numeric ranges `data_contracts/demo` declares: generated values are capped to them (after the label
is drawn; the caps touch a handful of rows in the tails), so every seed's data keeps its contract."""


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _z(x: np.ndarray) -> np.ndarray:
    return (x - np.nanmean(x)) / np.nanstd(x)


def _category(rng: np.random.Generator, choices: list[str], logits: np.ndarray) -> pd.Categorical:
    """One draw per row from `choices` with per-row softmax(logits) probabilities."""
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    index = (p.cumsum(axis=1) < rng.random(len(p))[:, None]).sum(axis=1)
    codes = np.minimum(index, len(choices) - 1)
    return pd.Categorical.from_codes(codes, categories=choices)  # type: ignore[call-overload]  # stubs: list


def _blank(rng: np.random.Generator, frame: pd.DataFrame, rates: dict[str, float]) -> None:
    """Make a random share of each named column missing, in place."""
    for column, rate in rates.items():
        frame.loc[rng.random(len(frame)) < rate, column] = np.nan


MISSING_RATES = {"income": 0.08, "balance": 0.03, "region": 0.02, "avg_basket": 0.03,
                 "days_since_last_order": 0.03, "preferred_channel": 0.04, "premium": 0.03,
                 "vehicle_type": 0.02}
"""The share of values each column misses in the demo's data."""


def _customers(rng: np.random.Generator, ids: np.ndarray,
               missing: dict[str, float] = MISSING_RATES) -> pd.DataFrame:
    """Every column of every institution for `ids` (as if all were customers everywhere) and the label.

    `missing` gives the shares of values blanked.
    """
    n = len(ids)
    age = np.clip(rng.normal(45, 15, n), 18, 90).astype(np.int64)
    affluence = rng.normal(size=n) + 0.02 * (age - 45)
    digital = rng.normal(size=n) - 0.03 * (age - 45)
    risk = rng.normal(size=n) - 0.01 * (age - 45)
    f = pd.DataFrame({ID_COLUMN: ids})
    # bank
    f["age"] = age
    f["income"] = np.round(np.exp(10.3 + 0.45 * affluence + rng.normal(0, 0.3, n)), -2)
    f["balance"] = np.round(np.exp(8 + 0.9 * affluence + rng.normal(0, 1, n)) - 500, 2)
    f["tenure_years"] = np.round(np.minimum(age - 18, rng.exponential(8, n)), 1)
    f["n_products"] = np.minimum(1 + rng.poisson(0.8 + 0.5 * np.maximum(affluence, 0)), 8)
    f["segment"] = pd.Categorical(np.select([affluence > 1.6, affluence > 0.6, age < 25],
                                            ["private", "affluent", "student"], "mass"),
                                  categories=["mass", "affluent", "private", "student"])
    f["region"] = _category(rng, ["capital", "north", "south", "east", "west"],
                            np.tile(np.log([0.3, 0.2, 0.2, 0.15, 0.15]), (n, 1)))
    f["has_mortgage"] = rng.random(n) < _sigmoid(0.8 * affluence - 0.04 * np.abs(age - 40))
    # e-commerce
    orders = rng.poisson(np.exp(1.2 + 0.8 * digital + 0.2 * affluence))
    active = orders > 0
    f["orders_12m"] = orders
    f["avg_basket"] = np.where(active,
                               np.round(np.exp(3.6 + 0.35 * affluence + rng.normal(0, 0.4, n)), 2), np.nan)
    f["days_since_last_order"] = np.where(
        active, np.minimum(365, np.floor(rng.exponential(365 / (orders + 1)))), np.nan)
    f["preferred_channel"] = _category(rng, ["app", "web", "marketplace", "phone"],
                                       np.stack([1.2 * digital, np.zeros(n), 0.3 * digital - 0.5,
                                                 -1.2 * digital - 1.5], axis=1))
    f["returns_rate"] = np.where(active, np.round(rng.beta(2, 12, n), 3), np.nan)
    f["newsletter"] = rng.random(n) < _sigmoid(0.6 * digital - 0.3)
    # insurer
    f["policies"] = 1 + rng.poisson(np.exp(-0.4 + 0.3 * affluence))
    f["claims_3y"] = rng.poisson(0.2 + 0.3 * np.exp(0.6 * risk))
    f["premium"] = np.round(np.maximum(120, 300 + 250 * f["policies"] + 180 * f["claims_3y"] + 100 * risk
                                       + rng.normal(0, 80, n)), 2)
    f["vehicle_type"] = _category(rng, ["none", "compact", "sedan", "suv", "van", "motorbike"],
                                  np.stack([np.full(n, -0.5), np.zeros(n), 0.4 * affluence,
                                            0.9 * affluence - 0.5, np.full(n, -1.2), 0.6 * risk - 1.5],
                                           axis=1))
    score = risk + 0.5 * f["claims_3y"].to_numpy()
    f["risk_class"] = pd.Categorical.from_codes(  # type: ignore[call-overload]  # pandas-stubs: a list
        np.digitize(score, np.quantile(score, [0.2, 0.4, 0.6, 0.8])), categories=["A", "B", "C", "D", "E"])
    # the offer (a travel card bundled with trip insurance): every institution's columns matter
    vehicle = f["vehicle_type"].astype(object)
    logit = (
        0.8 * _z(np.log(f["income"].to_numpy())) + 0.5 * (f["n_products"].to_numpy() >= 3)
        - 0.6 * (f["segment"] == "student").to_numpy()
        + 1.0 * _z(np.log1p(orders)) + 0.9 * f["newsletter"].to_numpy()
        + 0.7 * (f["preferred_channel"] == "app").to_numpy()
        + 1.1 * vehicle.isin(["suv", "van"]).to_numpy() - 0.9 * f["risk_class"].isin(["D", "E"]).to_numpy()
        + 0.8 * ((orders > 6) & (f["policies"].to_numpy() >= 2))
        - 1.3
    )
    f[LABEL] = np.where(rng.random(n) < _sigmoid(logit), "yes", "no")
    for column, (low, high) in CONTRACT_BOUNDS.items():  # the demo contracts' ranges: rare tails are capped
        f[column] = f[column].clip(low, high)
    _blank(rng, f, missing)
    return f


def _memberships(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Which of `n` customers each institution holds: a core at all three, the rest at one or two."""
    order = rng.permutation(n)
    n_core = round(CORE_SHARE * n)
    rest = order[n_core:]
    member = {name: np.zeros(n, dtype=bool) for name in SHARES}
    for name in SHARES:
        member[name][order[:n_core]] = True
    for name, share in SHARES.items():
        # a customer every other institution already holds would enlarge the all-three core: skip them
        at_all_others = np.logical_and.reduce([member[o] for o in SHARES if o != name])
        eligible = rest[~at_all_others[rest] & ~member[name][rest]]
        extra = min(max(round(share * n) - n_core, 0), len(eligible))
        member[name][rng.choice(eligible, extra, replace=False)] = True
    return member


def _write_batch(rng: np.random.Generator, universe: pd.DataFrame, out: Path, stem: str,
                 with_label: bool) -> dict:
    """Write each institution's shuffled slice of `universe` and the pooled truth table; return the counts."""
    member = _memberships(rng, len(universe))
    counts = {}
    for name, columns in COLUMNS.items():
        keep = [ID_COLUMN] + columns + ([LABEL] if with_label and name == LABEL_HOLDER else [])
        rows = np.flatnonzero(member[name])
        frame = universe.iloc[rng.permutation(rows), :][keep].reset_index(drop=True)
        (out / name).mkdir(parents=True, exist_ok=True)
        frame.to_parquet(out / name / f"{stem}.parquet", index=False)
        counts[name] = len(frame)
    truth = universe.copy()
    for name, columns in COLUMNS.items():
        for column in columns:
            values = truth[column]
            if pd.api.types.is_bool_dtype(values) or pd.api.types.is_integer_dtype(values):
                values = values.astype("boolean" if pd.api.types.is_bool_dtype(values) else "Int64")
            truth[column] = values.where(member[name])
        truth[f"in_{name}"] = member[name]
    (out / "truth").mkdir(parents=True, exist_ok=True)
    truth.to_parquet(out / "truth" / f"{stem}.parquet", index=False)
    return {"counts": counts, "overlap": int(np.logical_and.reduce(list(member.values())).sum())}


SAMPLE_EPOCH = np.datetime64("2026-01-01")
"""The day the sample table's `customer_since` dates count back from (fixed: the table is reproducible)."""


def make_customer_table(n_customers: int = 5000, seed: int = 0) -> pd.DataFrame:
    """The demo's customers as one ordinary table.

    Every institution's columns, the label `responded`, and a `customer_since` ISO date, with missing values.
    For trying `fedforest simulate` (`fedforest sample-table`); a federation never has this pooled table.
    """
    if n_customers < 20:
        raise ParameterError(f"the sample table needs at least 20 customers, got {n_customers}")
    rng = np.random.default_rng(seed)
    width = max(6, len(str(n_customers - 1)))
    ids = np.array([f"C{i:0{width}d}" for i in range(n_customers)], dtype=object)
    # a label: complete
    frame = _customers(rng, ids, {k: v for k, v in MISSING_RATES.items() if k != "premium"})
    days = np.round(frame["tenure_years"].to_numpy() * 365.25).astype("timedelta64[D]")
    position = cast(int, frame.columns.get_loc("tenure_years"))  # a unique column's: an int
    frame.insert(position, "customer_since",
                 pd.Series(SAMPLE_EPOCH - days).dt.strftime("%Y-%m-%d"))
    return frame.drop(columns="tenure_years")


def make_vertical_scenario(out_dir: str | Path, n_customers: int = 6000, seed: int = 0,
                           n_new: int | None = None) -> dict:
    """Write the bank / e-commerce / insurer demo (see module docstring) and return its paths and counts."""
    out = Path(out_dir)
    n_new = max(n_customers // 5, 1) if n_new is None else n_new
    if n_customers < 20 or n_new < 20:
        raise ParameterError("the scenario needs at least 20 customers per batch, got "
                             f"n_customers={n_customers}, n_new={n_new}")
    rng = np.random.default_rng(seed)
    width = max(6, len(str(n_customers + n_new - 1)))
    ids = np.array([f"C{i:0{width}d}" for i in range(n_customers + n_new)], dtype=object)
    universe = _customers(rng, ids)
    train = _write_batch(rng, universe.iloc[:n_customers].reset_index(drop=True), out, "train",
                         with_label=True)
    new = _write_batch(rng, universe.iloc[n_customers:].reset_index(drop=True), out, "new", with_label=False)
    (out / "truth" / "README.md").write_text(
        "DEMO-ONLY ground truth: every customer with all institutions' columns pooled, membership flags "
        "(in_<institution>) and the true `responded`. No real federation has this table; it exists to "
        "compute a centralized reference model and to score predictions on the new batch.\n")
    return {
        "out_dir": str(out), "id_column": ID_COLUMN, "label": LABEL, "label_holder": LABEL_HOLDER,
        "institutions": {
            name: {"train": str(out / name / "train.parquet"), "new": str(out / name / "new.parquet"),
                   "train_rows": train["counts"][name], "new_rows": new["counts"][name]}
            for name in COLUMNS
        },
        "truth": {"train": str(out / "truth" / "train.parquet"), "new": str(out / "truth" / "new.parquet")},
        "overlap": {"train": train["overlap"], "new": new["overlap"]},
    }
