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
