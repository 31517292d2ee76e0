"""A version's decision threshold (issue #33) is what its batch predictions decide at, at every institution.

The threshold travels in the master's signed manifest: each institution reads it from the manifest it stored
(or loads) with its own copy, never from a prediction request.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest


@pytest.mark.parametrize("threshold", [None, 0.3, 0.7])
def test_horizontal_batch_predictions_decide_at_the_versions_threshold(tmp_path: Path, threshold) -> None:
    from fedcore.models.publish import register_everywhere
    from tests.models.registering import agents, master_registry, table, trained_session

    institutions = agents(tmp_path)
    session = trained_session({n: a.handle for n, a in institutions.items()})
    manifest = {"algorithm": "extra-trees", "setting": "horizontal",
                "parties": session.manifest_entries()["parties"],
                **({} if threshold is None else {"decision_threshold": threshold})}
    register_everywhere(master_registry(tmp_path), session, "readmission", manifest, session.master_tables())
    for seed, institution in enumerate(institutions.values(), start=20):
        batch = table(seed=seed, n_rows=300).drop(columns=["label"])
        institution.data.load_batch = lambda b=batch: b
    session.predict()
    for institution in institutions.values():
        assert institution.decision_threshold == threshold
        (path,) = institution.data.predictions_dir.rglob("*.parquet")
        out = pd.read_parquet(path)
        proba = out[["proba_0", "proba_1"]].to_numpy()
        expected = (np.argmax(proba, axis=1) if threshold is None else (proba[:, 1] >= threshold).astype(int))
        np.testing.assert_array_equal(out["prediction"].to_numpy(), expected)
        if threshold is not None:  # the threshold changes some rows' class (else the test proves nothing)
            assert (expected != np.argmax(proba, axis=1)).any()


def test_vertical_predictions_delivered_to_the_requester_decide_at_the_versions_threshold(tmp_path) -> None:
    from fedcore.data.scenario import make_vertical_scenario
    from fedcore.models.registry import ModelRegistry
    from fedcore.transport.inprocess import InProcessTransport
    from fedcore.trees.params import ForestParams
    from fedcore.vertical.session import VerticalSession
    from tests.keys import master_key
    from tests.vertical.test_session import _agents

    scenario = make_vertical_scenario(tmp_path / "scenario", n_customers=1200, seed=5)
    agents = _agents(scenario, tmp_path)
    session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                              ForestParams(n_estimators=4, max_depth=4, random_state=1), holdout_fraction=0.2,
                              min_overlap=100)
    session.align()
    session.train()
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("demo", {"parties": session.manifest_entries()["parties"],
                                         "decision_threshold": 0.25}, session.master_tables())
    session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    holder = scenario["label_holder"]
    session.predict(holder)
    assert agents[holder].decision_threshold == 0.25
    (path,) = (tmp_path / "predictions" / holder).rglob("*.parquet")
    out = pd.read_parquet(path)
    classes = agents[holder].party.classes_
    proba = out[[f"proba_{c}" for c in classes]].to_numpy()
    np.testing.assert_array_equal(out["prediction"].to_numpy(), classes[(proba[:, 1] >= 0.25).astype(int)])
    assert (proba[:, 1] >= 0.25).sum() > (np.argmax(proba, axis=1) == 1).sum()  # the threshold moved rows
