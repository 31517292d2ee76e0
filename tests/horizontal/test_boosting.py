"""Horizontal histogram boosting under secure aggregation (issue #32).

Exactly lossless: the per node, feature and bin sums of (count, g, h) are integers (fixed-point g and h), so
1, 2 and 3 parties grow the bytes of the single-party run (pinned in tests/trees/test_model_digests.py).
The master reads only masked sums; a party's rows reach their margins in the order the model predicts.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.boosting import HorizontalBoostingClassifier, HorizontalBoostingRegressor
from fedcore.horizontal.boosting.party import HorizontalBoostingParty
from fedcore.privacy.secagg import unmask_sum
from fedcore.protocol.messages import Message
from fedcore.transport.base import MASTER
from tests.horizontal.common import horizontal_table, split_rows
from tests.thresholds import assert_decides_at_thresholds
from tests.wire import continuous_bits, raw_values_in

CASES = {
    "logistic": (HorizontalBoostingClassifier, dict(task="classification", n_classes=2),
                 dict(n_estimators=4, max_depth=4, learning_rate=0.5, gamma=0.1, min_child_weight=2.0)),
    "softmax": (HorizontalBoostingClassifier, dict(task="classification", n_classes=3),
                dict(n_estimators=3, max_depth=3, reg_lambda=0.5, colsample_bytree=0.6)),
    "squared error": (HorizontalBoostingRegressor, dict(task="regression"),
                      dict(n_estimators=4, max_depth=4, max_bins=32)),
}


def _fit(case: str, n_parties: int, **extra):
    cls, table_args, params = CASES[case]
    table = horizontal_table(seed=5, n_rows=400, **table_args)
    model = cls(**params, allow_data_ranges=True, random_state=3, **extra)
    return table, model.fit(split_rows(table, n_parties, seed=n_parties), label="target")


@pytest.mark.parametrize("case", list(CASES))
def test_one_two_and_three_parties_grow_the_same_bytes(case: str) -> None:
    table, single = _fit(case, 1)
    features = table.drop(columns="target")
    assert single.model_.n_nodes > 3 * single.model_.n_trees  # trees that split, not stumps
    for n_parties in (2, 3):
        _, federated = _fit(case, n_parties)
        assert federated.model_.same_as(single.model_)
        assert federated.model_.combination == single.model_.combination
        np.testing.assert_array_equal(federated._predict_values(features), single._predict_values(features))
        np.testing.assert_array_equal(federated.feature_importances_, single.feature_importances_)


@pytest.mark.parametrize("case", list(CASES))
def test_gain_importances_fall_on_the_features_the_trees_split_on(case: str) -> None:
    """Total split gain per feature, summing to 1: positive exactly on the features some split uses."""
    table, model = _fit(case, 2)
    importances = model.feature_importances_
    used = np.unique(model.model_.feature[model.model_.feature >= 0])
    assert importances.sum() == pytest.approx(1.0, abs=1e-12) and importances.min() >= 0
    assert np.flatnonzero(importances > 0).tolist() == used.tolist()
    cls, _, params = CASES[case]
    stump = cls(**{**params, "n_estimators": 1, "max_depth": 1}, allow_data_ranges=True, random_state=3)
    stump.fit(split_rows(table, 2, seed=2), label="target")
    roots = stump.model_.feature[stump.model_.depth == 0]  # one split per tree of the round: their gains
    assert (roots >= 0).all()
    assert np.flatnonzero(stump.feature_importances_ > 0).tolist() == np.unique(roots).tolist()
    if len(roots) == 1:  # one split: all the gain is its feature's
        assert stump.feature_importances_.tolist() == [float(j == roots[0]) for j in range(len(importances))]


def test_a_partys_margins_grow_in_the_order_the_model_predicts() -> None:
    """A party's training margins plus the last round are the model's margins for its rows, bit for bit."""
    _, model = _fit("softmax", 2)
    forest, k = model.model_, model.master_.n_outputs
    for party in model.parties_:
        leaves = forest.apply(party.rows.X)
        expected = forest.combination.margins(forest.value[leaves])
        margins = party.rows.get_margins()
        for t in range(forest.n_trees - k, forest.n_trees):
            margins[:, t % k] += forest.value[leaves[:, t], 0]
        np.testing.assert_array_equal(margins, expected)


def test_the_master_sees_only_masked_sums() -> None:
    table = horizontal_table(seed=5, n_rows=400, task="classification", n_classes=3)
    parties = split_rows(table, 3, seed=3)
    runs = {secure: HorizontalBoostingClassifier(3, max_depth=3, allow_data_ranges=True, random_state=3,
                                                 secure_aggregation=secure, record_payloads=True)
            .fit(parties, label="target") for secure in (True, False)}
    assert runs[True].model_.same_as(runs[False].model_)
    to_master = [(e, Message.from_bytes(e.payload)) for e in runs[True].transcript_ if e.receiver == MASTER]
    assert {m.kind for _, m in to_master} == {"hello_reply", "boost_masked", "ack"}
    masked: dict[int, dict[str, np.ndarray]] = {}
    for entry, message in to_master:
        if message.kind == "boost_masked":
            assert list(message.arrays) == ["masked"] and message.arrays["masked"].dtype == np.uint64
            masked.setdefault(entry.round, {})[entry.sender] = message.arrays["masked"]
    values = np.concatenate([v for r in masked.values() for v in r.values()])
    for byte in (values >> np.uint64(56), values & np.uint64(0xFF)):  # uniform in the 64-bit ring
        assert stats.chisquare(np.bincount(byte.astype(np.int64), minlength=256)).pvalue > 1e-6
    # the plain run's per-party vectors: exactly their sum reaches the master, none of them does
    plain: dict[int, dict[str, np.ndarray]] = {}
    for entry in runs[False].transcript_:
        if entry.receiver == MASTER and entry.kind == "boost_plain":
            plain.setdefault(entry.round, {})[entry.sender] = Message.from_bytes(entry.payload).arrays["sums"]
    assert len(plain) == len(masked) > 2
    # histogram subtraction: some levels ask for fewer nodes than are open (the master derives the rest)
    asked = [Message.from_bytes(e.payload).arrays.get("compute") for e in runs[True].transcript_
             if e.kind == "boost_level" and e.receiver == runs[True].parties_[0].name]
    assert any(c is not None and 0 < c.sum() < len(c) for c in asked)
    names = [p.name for p in runs[True].parties_]
    for secure_round, plain_round in zip(sorted(masked), sorted(plain), strict=True):
        np.testing.assert_array_equal(unmask_sum([masked[secure_round][n] for n in names]),
                                      sum(plain[plain_round][n].astype(np.int64) for n in names))
    windows = [v[i:i + 6].astype(np.int64).tobytes() for r in plain.values() for v in r.values()
               for i in range(0, len(v) - 6, 997) if len(set(v[i:i + 6].tolist())) >= 4]
    assert len(windows) > 10
    assert not [w for entry, _ in to_master for w in windows if w in entry.payload]
    # nor any raw feature value in what else reaches the master (its masked vectors are uniform, above)
    raw = continuous_bits(parties, [f"num{i}" for i in range(8)])
    assert len(raw) > 100
    assert not [m.kind for e, m in to_master if m.kind != "boost_masked" and raw_values_in(e.payload, raw)]


def test_parameters_it_cannot_honour_are_refused() -> None:
    table = horizontal_table(seed=5, n_rows=100, task="regression")
    with pytest.raises(ParameterError, match=r"^horizontal boosting takes subsample=1.0 only so far: a row's "
                                             r"draw would depend on which party holds it"):
        HorizontalBoostingRegressor(2, subsample=0.5, allow_data_ranges=True).fit([table], label="target")
    with pytest.raises(ParameterError, match=r"^horizontal boosting cuts the declared feature domains into "
                                             r"its bins, never the data: pass feature_ranges="):
        HorizontalBoostingRegressor(2).fit([table], label="target")


def test_a_party_refuses_bins_other_than_its_own() -> None:
    """Master and party derive the bins from the same contract and max_bins; hello says which."""
    _, model = _fit("squared error", 2)  # max_bins 32
    party = model.parties_[0]
    other = HorizontalBoostingParty("other", split_rows(horizontal_table(seed=5, n_rows=400,
                                                                         task="regression"), 2)[0],
                                    model.schema_, low=party.low, high=party.high, max_bins=64, secure=False)
    master = model.master_
    hello = {"algorithm": "boosting", "schema": model.schema_.fingerprint(), "domains": None,
             "bins": master.bins.fingerprint(), "n_parties": 1, "secure": False, "loss": "reg:squarederror",
             "n_outputs": 1, "session_id": "00" * 16}
    from fedcore.horizontal.ppdert.agreed import domain_fingerprint

    hello["domains"] = domain_fingerprint(master.low, master.high)
    with pytest.raises(ProtocolError, match=r"^party 'other': the master's feature domains or bins differ "
                                            r"from the party's; both must come from the same data contract "
                                            r"and max_bins$"):
        other.handle(Message("hello", hello))


class _SkewingParty(HorizontalBoostingParty):
    """A hostile institution: adds rows to one bin of one feature in every level's histograms."""

    def _reply(self, vector, h):
        if vector.size > 3:  # a level's histograms, not the base score's sums
            vector = vector.copy()
            vector[3] += 5  # feature 0, bin 1: count
        return super()._reply(vector, h)


class _WithASkewingParty(HorizontalBoostingClassifier):
    def _make_parties(self, frames, schema):
        honest = super()._make_parties(frames, schema)
        hostile = honest[0]
        hostile.__class__ = _SkewingParty
        return honest


def test_masked_histograms_that_do_not_add_up_are_refused_naming_no_party() -> None:
    table = horizontal_table(seed=5, n_rows=200, task="classification", n_classes=2)
    refusal = (r"^the unmasked sum over all parties \(secure aggregation masks each party's counts: none can "
               r"be named\): the summed histograms are not those of the declared rows \(a feature's bins "
               r"must add up to the node, counts >= 0\)$")
    with pytest.raises(ProtocolError, match=refusal):
        _WithASkewingParty(2, max_depth=2, allow_data_ranges=True).fit(split_rows(table, 2), label="target")


def test_the_model_table_keeps_how_its_trees_combine() -> None:
    """A boosting model's Arrow table states its base score and link; read back, it predicts the same."""
    from fedcore.horizontal.model import HorizontalForest
    from fedcore.trees.combination import MEAN

    table, model = _fit("softmax", 2)
    back = HorizontalForest.from_table(model.model_.to_table())
    assert back.combination == model.model_.combination != MEAN and back.same_as(model.model_)
    encoded = model.schema_.encode(table.drop(columns="target"))
    np.testing.assert_array_equal(back.predict_values(encoded), model.model_.predict_values(encoded))


def test_a_decision_threshold_decides_the_positive_class_at_or_above_it() -> None:
    """Binary: the second class where its probability >= the threshold; a bad one is refused at predict."""
    table, model = _fit("logistic", 2)
    features = table.drop(columns="target")
    assert_decides_at_thresholds(model, features)
    assert (model.set_params(decision_threshold=0.2).predict(features)
            != model.set_params(decision_threshold=0.8).predict(features)).any()  # the threshold matters here


def test_a_decision_threshold_leaves_a_multiclass_prediction_most_probable() -> None:
    table, model = _fit("softmax", 2, decision_threshold=0.1)
    features = table.drop(columns="target")
    proba = model.predict_proba(features)
    np.testing.assert_array_equal(model.predict(features), model.classes_[np.argmax(proba, axis=1)])


def test_a_party_refuses_a_master_asking_for_other_margins_than_its_loss_grows() -> None:
    """n_outputs sizes every row's margins (on Dask, on every worker): the loss decides it, not the master."""
    from fedcore.horizontal.ppdert.agreed import domain_fingerprint

    _, model = _fit("squared error", 2)
    party, master = model.parties_[0], model.master_
    other = HorizontalBoostingParty("other", split_rows(horizontal_table(seed=5, n_rows=400,
                                                                         task="regression"), 2)[0],
                                    model.schema_, low=party.low, high=party.high, max_bins=32, secure=False)
    hello = {"algorithm": "boosting", "schema": model.schema_.fingerprint(),
             "domains": domain_fingerprint(master.low, master.high), "bins": master.bins.fingerprint(),
             "n_parties": 1, "secure": False, "loss": "reg:squarederror", "n_outputs": 1_000_000,
             "session_id": "00" * 16}
    with pytest.raises(ProtocolError, match=r"^party 'other': loss 'reg:squarederror' grows 1 margins a row, "
                                            r"the master asked for 1000000$"):
        other.handle(Message("hello", hello))


def test_trees_from_the_master_must_be_walkable() -> None:
    """A split pointing back up its tree would hang every walk of the rows; a NaN leaf would reach margins."""
    from fedcore.horizontal.model import HorizontalForest
    from fedcore.horizontal.rows import checked_structure

    _, model = _fit("logistic", 2)
    forest, n_features = model.model_, model.schema_.n_features

    def altered(field: str, change) -> HorizontalForest:
        arrays = {name: np.array(values) for name, values in forest.arrays().items()}
        change(arrays[field])
        return HorizontalForest.from_arrays(arrays, n_trees=forest.n_trees, task=forest.task,
                                            algorithm=forest.algorithm, combination=forest.combination)

    assert checked_structure("p", forest, n_features) is forest
    split = int(np.flatnonzero(forest.feature >= 0)[-1])
    itself = split - int(forest.tree_offsets()[forest.tree[split]])  # its index within its tree
    walk = (r"^party 'p': the master's trees have a split whose children are not after it in its tree, or "
            r"whose feature is not the schema's$")
    for field, change in (("left", lambda a: a.__setitem__(split, itself)),  # a cycle
                          ("right", lambda a: a.__setitem__(split, 10**6)),
                          ("feature", lambda a: a.__setitem__(split, n_features))):
        with pytest.raises(ProtocolError, match=walk):
            checked_structure("p", altered(field, change), n_features)
    with pytest.raises(ProtocolError, match=r"^party 'p': the master's trees have a leaf value that is not "
                                            r"finite$"):
        checked_structure("p", altered("value", lambda a: a.__setitem__(0, np.nan)), n_features)
