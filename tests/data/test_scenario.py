"""The bank / e-commerce / insurer demo scenario.

Shapes, overlaps, determinism, where the label is, and that the federation is worth it (three parties beat the
bank alone).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.data.scenario import COLUMNS, make_vertical_scenario
from fedcore.privacy.hashing import hash_ids
from fedcore.vertical.alignment import align_frame, intersect_hashes
from fedcore.vertical.estimators import FederatedForestClassifier

KEY = b"consortium-key-for-tests-0123456789"
INSTITUTIONS = ("bank", "ecommerce", "insurer")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), seed=0)


def read(result: dict, stem: str) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(result["institutions"][name][stem]) for name in INSTITUTIONS}


def test_files_shapes_and_counts(scenario) -> None:
    train, new = read(scenario, "train"), read(scenario, "new")
    assert {n: len(f) for n, f in train.items()} == {"bank": 5000, "ecommerce": 4500, "insurer": 4000}
    assert {n: len(f) for n, f in new.items()} == {"bank": 1000, "ecommerce": 900, "insurer": 800}
    for name, frame in train.items():
        assert scenario["institutions"][name]["train_rows"] == len(frame)
        expected = ["customer_id"] + COLUMNS[name] + (["responded"] if name == "bank" else [])
        assert list(frame.columns) == expected
        assert list(new[name].columns) == ["customer_id"] + COLUMNS[name]
        assert frame["customer_id"].str.fullmatch(r"C\d{6}").all() and frame["customer_id"].is_unique
        assert not frame["customer_id"].is_monotonic_increasing  # shuffled per institution
        assert frame.isna().any().any()  # every institution has some missing values
    bank = train["bank"]
    assert isinstance(bank["segment"].dtype, pd.CategoricalDtype) and bank["has_mortgage"].dtype == bool
    assert isinstance(train["insurer"]["risk_class"].dtype, pd.CategoricalDtype)
    assert set(bank["responded"]) == {"yes", "no"} and 0.25 < (bank["responded"] == "yes").mean() < 0.6


def test_overlaps_are_partial_and_new_customers_are_fresh(scenario) -> None:
    for stem, n_total in (("train", 6000), ("new", 1200)):
        ids = {n: set(f["customer_id"]) for n, f in read(scenario, stem).items()}
        common = set.intersection(*ids.values())
        assert 0.45 * n_total <= len(common) <= 0.55 * n_total
        assert scenario["overlap"][stem] == len(common)
        for a, b in (("bank", "ecommerce"), ("bank", "insurer"), ("ecommerce", "insurer")):
            assert len(common) < len(ids[a] & ids[b]) < min(len(ids[a]), len(ids[b]))
        assert len(set.union(*ids.values())) <= n_total
    train_ids = set().union(*(set(f["customer_id"]) for f in read(scenario, "train").values()))
    new_ids = set().union(*(set(f["customer_id"]) for f in read(scenario, "new").values()))
    assert not train_ids & new_ids


def test_label_only_in_the_bank_training_file(scenario) -> None:
    for stem in ("train", "new"):
        for name, frame in read(scenario, stem).items():
            holds_label = name == "bank" and stem == "train"
            assert ("responded" in frame.columns) == holds_label
            if not holds_label:  # nor any column hiding the label's values
                assert not {"yes", "no"} & set(frame.select_dtypes(exclude="number").stack().astype(str))


def test_truth_table_pools_the_institutions(scenario) -> None:
    truth = pd.read_parquet(scenario["truth"]["train"]).set_index("customer_id")
    assert len(truth) == 6000
    train = read(scenario, "train")
    for name, frame in train.items():
        assert int(truth[f"in_{name}"].sum()) == len(frame)
        frame = frame.set_index("customer_id")
        pooled = truth.loc[frame.index, frame.columns]
        for column in frame.columns:
            assert pooled[column].astype(object).where(pooled[column].notna(), None).tolist() == \
                frame[column].astype(object).where(frame[column].notna(), None).tolist()
    assert len(pd.read_parquet(scenario["truth"]["new"])) == 1200


def test_deterministic_by_seed(scenario, tmp_path) -> None:
    again = make_vertical_scenario(tmp_path / "again", seed=0)
    other = make_vertical_scenario(tmp_path / "other", seed=1)
    for name in INSTITUTIONS:
        for stem in ("train", "new"):
            first = pd.read_parquet(scenario["institutions"][name][stem])
            pd.testing.assert_frame_equal(first, pd.read_parquet(again["institutions"][name][stem]))
        assert not pd.read_parquet(other["institutions"][name]["train"]).equals(
            pd.read_parquet(scenario["institutions"][name]["train"]))


def test_federated_beats_bank_only_on_held_out_rows(scenario) -> None:
    frames = read(scenario, "train")
    plan = intersect_hashes({name: hash_ids(frame["customer_id"], KEY) for name, frame in frames.items()})
    parties = {name: align_frame(frame, plan.positions[name]).drop(columns="customer_id")
               for name, frame in frames.items()}
    cut = int(0.7 * plan.n_common)
    train = {name: frame.iloc[:cut] for name, frame in parties.items()}
    test = {name: frame.iloc[cut:].drop(columns="responded", errors="ignore")
            for name, frame in parties.items()}
    y = parties["bank"]["responded"].iloc[cut:].to_numpy()
    federated = FederatedForestClassifier(n_estimators=20, max_depth=8).fit(train, label="responded")
    bank_only = FederatedForestClassifier(n_estimators=20, max_depth=8).fit({"bank": train["bank"]},
                                                                            label="responded")
    acc_federated = float(np.mean(federated.predict(test) == y))
    acc_bank = float(np.mean(bank_only.predict({"bank": test["bank"]}) == y))
    # measured at seed 0: 0.743 vs 0.631; seeds 0-4 all show a gap of 10 points or more
    assert acc_federated >= acc_bank + 0.05, (acc_federated, acc_bank)


@pytest.mark.parametrize("seed", range(6))
def test_every_seed_keeps_the_demo_contracts_numeric_ranges(tmp_path, seed) -> None:
    from pathlib import Path

    from fedcore.contracts.model import load_contract

    scenario = make_vertical_scenario(tmp_path, n_customers=1500, seed=seed)
    contracts = Path(__file__).resolve().parents[2] / "data_contracts" / "demo"
    for name, files in scenario["institutions"].items():
        frame = pd.read_parquet(files["train"])
        for column in load_contract(contracts / f"{name}.yaml").columns:
            if column.min is not None:
                values = frame[column.name].dropna()
                assert column.min <= values.min() and values.max() <= column.max, (name, column.name)
