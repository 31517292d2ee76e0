"""Vertical boosting with every party's rows on a Dask cluster grows the in-process model (issues #29, #32).

Blocks of 70 rows (300-row tables: 5 blocks a party), submitted in a shuffled order; each loss is compared
with the same estimator in process and the same seed: the trees, every column's splits and the predictions
byte for byte (`tests.vertical.test_boosting._model_bytes`), and in plain mode every message that crossed.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.compute.dask_vertical import DaskVerticalRows
from tests.compute.workers import losable_cluster, lose_a_worker_on_call
from tests.vertical.test_boosting import _fit, _model_bytes

BLOCK = 70


def _payloads(model) -> list[tuple[str, str, str, bytes]]:
    """Every message that crossed, but setup replies: they report the memory available at that moment."""
    return [(e.sender, e.receiver, e.kind, e.payload) for e in model.transcript_ if e.kind != "setup_reply"]


@pytest.fixture
def shuffled(monkeypatch) -> list[DaskVerticalRows]:
    """Every Dask party's blocks submitted in a shuffled order; the rows made, for the test to check."""
    made: list[DaskVerticalRows] = []
    init = DaskVerticalRows.__init__

    def shuffled_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.submit_order = list(np.random.default_rng(len(self.blocks)).permutation(len(self.blocks)))
        assert self.submit_order != sorted(self.submit_order)
        made.append(self)

    monkeypatch.setattr(DaskVerticalRows, "__init__", shuffled_init)
    return made


@pytest.mark.parametrize(("loss", "workers"), [
    ("logistic", "three_workers"),
    pytest.param("softmax", "three_workers", marks=pytest.mark.slow),
    pytest.param("squared error", "three_workers", marks=pytest.mark.slow),
    pytest.param("logistic", "one_worker", marks=pytest.mark.slow)])
def test_boosting_on_dask_is_the_in_process_model(loss, workers, request, shuffled) -> None:
    client = request.getfixturevalue(workers)
    expected, frames, _ = _fit(loss, 3, record_payloads=True)
    got, _, _ = _fit(loss, 3, record_payloads=True, compute=client, block_rows=BLOCK)
    assert len(shuffled) == 3 and all(len(rows.blocks) == 5 for rows in shuffled)
    assert _model_bytes(got, frames) == _model_bytes(expected, frames)
    sent, received = _payloads(expected), _payloads(got)
    batches = [p for p in sent if p[2] == "begin_batch"]  # each carries its round's (g, h) to the parties
    assert [p for p in received if p[2] == "begin_batch"] == batches != []
    assert received == sent  # every message, byte for byte: the rounds' (g, h), gains, bits, leaf sums
    assert [type(p.rows).__name__ for p in got.parties_] == ["LocalRows"] * 3  # the rows left the cluster


def test_a_one_party_federation_on_dask_is_the_in_process_model(three_workers) -> None:
    """The label holder alone: its leaf weights, recorded per block, make every round's margins."""
    expected, frames, _ = _fit("squared error", 1)
    got, _, _ = _fit("squared error", 1, compute=three_workers, block_rows=BLOCK)
    assert _model_bytes(got, frames) == _model_bytes(expected, frames)


@pytest.mark.timeout(180)
def test_a_worker_lost_mid_boosting_still_gives_the_same_model(monkeypatch) -> None:
    """Past the first round: the lost blocks' partitions and leaf weights are rebuilt from lineage."""
    with losable_cluster() as (cluster, client):
        # 3 parties a level, 3 levels a round: the 14th search is in round 2 of 4
        lost = lose_a_worker_on_call(monkeypatch, DaskVerticalRows, "best_splits", 14, cluster, client)
        got, frames, _ = _fit("logistic", 3, compute=client, block_rows=BLOCK)
        assert lost and len(client.scheduler_info()["workers"]) == 2
    assert _model_bytes(got, frames) == _model_bytes(_fit("logistic", 3)[0], frames)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "loss"), [("ou", "logistic"), ("paillier", "softmax")])
def test_secure_boost_on_dask_grows_the_in_process_model(three_workers, mode, loss) -> None:
    """A passive party's encrypted bin sums per block, multiplied at its agent, are the in-process ones."""
    from fedcore.privacy.schemes import scheme

    key = scheme(mode).generate(1024, insecure_for_tests=True)
    params = {"n_estimators": 2, "privacy": mode, "label_key": key}
    expected, frames, _ = _fit(loss, 3, **params)
    got, _, _ = _fit(loss, 3, compute=three_workers, block_rows=BLOCK, **params)
    assert _model_bytes(got, frames) == _model_bytes(expected, frames)
    passive = [p for p in got.parties_ if not p.is_label_holder]
    # the bin sums ran on the blocks: the agents hold no ciphertext
    assert passive and all(p._passive_crypto is not None and p._passive_crypto.pairs_computed > 0
                           and not any(p._passive_crypto.powers) for p in passive)
