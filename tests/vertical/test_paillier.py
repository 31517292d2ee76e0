"""Vertical Federated Forest with encrypted labels, under Paillier and under Okamoto-Uchiyama.

Exactly the plain model, and what each role receives (no passive party gets a label, a statistic or anything
it can decrypt).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import ParameterError, ProtocolError
from fedcore.privacy.schemes import ENCRYPTED_MODES, scheme, scheme_for
from fedcore.protocol.messages import Message
from fedcore.vertical.encrypted import TargetEncoding
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from tests.conftest import mixed_table
from tests.vertical.test_lossless import _assert_same_forest


@pytest.fixture(scope="module", params=ENCRYPTED_MODES)
def key(request):
    """A small test key of each encrypted-label scheme: every test taking it runs under both."""
    return scheme(request.param).generate(1024, insecure_for_tests=True)


def _pair(cls, table, n_parties, key, **params):
    parties = split_vertical(table, n_parties, label="target", seed=7, label_party=0)
    plain = cls(random_state=3, **params).fit(parties, label="target")
    encrypted = cls(random_state=3, privacy=scheme_for(key.public).mode, label_key=key,
                    record_payloads=True, **params)
    encrypted.fit(parties, label="target")
    return plain, encrypted, [[c for c in p.columns if c != "target"] for p in parties]


CASES = {
    "binary, 2 parties": (FederatedForestClassifier, dict(n_classes=2), 2, dict(n_estimators=3, max_depth=4)),
    "3 classes, 3 parties, unlimited depth": (FederatedForestClassifier, dict(n_classes=3), 3,
                                              dict(n_estimators=2, min_samples_leaf=3)),
    "per-tree features, no bootstrap, entropy": (FederatedForestClassifier, dict(n_classes=3), 2,
                                                 dict(n_estimators=2, max_depth=5, feature_sampling="tree",
                                                      bootstrap=False, criterion="entropy", max_bins=16)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_encrypted_labels_grow_exactly_the_plain_forest(case, key) -> None:
    cls, table_args, n_parties, params = CASES[case]
    table = mixed_table(n_rows=240, seed=11, **table_args)
    plain, encrypted, columns = _pair(cls, table, n_parties, key, **params)
    _assert_same_forest(plain, encrypted)
    np.testing.assert_array_equal(plain.master_.structure.owner, encrypted.master_.structure.owner)
    test = mixed_table(n_rows=80, seed=12, **table_args)
    np.testing.assert_array_equal(plain.predict_proba([test[c] for c in columns]),
                                  encrypted.predict_proba([test[c] for c in columns]))
    passive = [p._passive_crypto for p in encrypted.parties_ if not p.is_label_holder]
    derived = sum(c.pairs_derived for c in passive)
    if params.get("feature_sampling") == "tree":  # siblings share candidates: one of each pair is subtracted
        assert derived > 0.3 * sum(c.pairs_computed for c in passive)


def test_integer_regression_targets_are_exact(key) -> None:
    table = mixed_table(n_rows=200, seed=4, task="regression")
    table["target"] = np.round(table["target"] * 10)  # integer-valued: fixed point at scale 1 is exact
    plain, encrypted, _ = _pair(FederatedForestRegressor, table, 2, key, n_estimators=2, max_depth=4)
    _assert_same_forest(plain, encrypted)


def test_real_regression_targets_decode_to_the_quantized_sums() -> None:
    y = np.array([-1.25, 0.1, 3.3, 2.0])
    encoding, values = TargetEncoding.for_labels(y, criterion=2, n_classes=0)
    assert encoding.scale == 2**20 and values.shape == (4, 1)  # q alone: splits need only (w, wy)
    weights = np.array([1, 2, 0, 3])
    sums = [sum(int(w) * int(v[0]) for w, v in zip(weights, values, strict=True))]
    w, wy = encoding.statistics(np.array([[*sums, int(weights.sum())]], dtype=object))[0]
    assert w == 6
    assert wy == pytest.approx(float(weights @ y), abs=6 * 2**-20)


@pytest.fixture(scope="module")
def recorded(key):
    table = mixed_table(n_rows=200, seed=21, n_classes=3)
    _, model, _ = _pair(FederatedForestClassifier, table, 3, key, n_estimators=2, max_depth=4)
    return model, table, key


def _received(model, name):
    return [(e.kind, Message.from_bytes(e.payload))
            for e in model.transport_.transcript if e.receiver == name]


def test_passive_parties_receive_only_ciphertexts_of_labels(recorded) -> None:
    model, table, key = recorded
    holder = model.label_holder_
    codes = np.unique(table["target"].to_numpy(), return_inverse=True)[1]
    allowed = {
        "setup": set(), "configure": {"global_index", "enc_y", f"seal_{holder.name}"},
        "begin_batch": {"feat_ptr", "feat_global", "feat_rank"},  # the batch's first level
        "find_splits": {"feat_ptr", "feat_global", "feat_rank", "split_mask", "split_owner"},
        # with the structure, the importance shares of its own splits (issue #33; docs/design.md)
        "finalize": {"tree", "node", "left", "right", "importance"},
        "apply_splits": {"positions", "tree", "node", "choice"},
    }
    for party in model.parties_:
        if party is holder:
            continue
        assert party._label_crypto is None and party._passive_crypto is not None
        assert not hasattr(party._passive_crypto, "key")  # it holds the public key only
        for kind, message in _received(model, party.name):
            extra = {k for k in message.arrays if not k.startswith("bits_")} - allowed[kind]
            assert extra == set(), (party.name, kind, extra)
            assert not {"y", "stats", "gain"} & set(message.arrays)
            if kind == "configure":
                ciphertexts = party._passive_crypto.public.from_bytes(message.arrays["enc_y"])
                layout = holder._label_crypto.layout
                opened = holder._label_crypto.key.decrypt(ciphertexts[:50])
                # they are the one-hots of classes 1 and 2, under the label holder's key, which the party
                # never got (class 0 encrypts 0)
                assert opened == [0 if c == 0 else 1 << (layout.slot_bits * (c - 1)) for c in codes[:50]]
        received = b"".join(e.payload for e in model.transport_.transcript if e.receiver == party.name)
        secrets = {k: v for k, v in holder._label_crypto.key.worker_fields().items() if k != "public"}
        assert set(secrets) >= {"p", "q"}
        for secret in secrets.values():
            assert secret.to_bytes((secret.bit_length() + 7) // 8, "big") not in received


def test_choices_a_passive_party_can_open_are_its_own_splits(recorded) -> None:
    model, _, _ = recorded
    for index, party in enumerate(model.parties_):
        if party.is_label_holder:
            continue
        owned = int(np.sum(party.model.feature >= 0))
        applied = sum(len(m.arrays["positions"])
                      for kind, m in _received(model, party.name) if kind == "apply_splits")
        assert applied == owned > 0
        assert int(np.sum(model.master_.structure.owner == index)) == owned


def test_master_receives_no_plain_labels_thresholds_or_statistics_of_passive_parties(recorded) -> None:
    model, table, _ = recorded
    holder = model.label_holder_.name
    for entry in model.transport_.transcript:
        if entry.receiver != "master":
            continue
        arrays = Message.from_bytes(entry.payload).arrays
        assert "y" not in arrays
        if entry.sender != holder:
            assert set(arrays) <= {"feature_ids", "seal_public", "packed", "sealed", "bits"}, (entry.kind,
                                                                                               set(arrays))
    blobs = [e.payload for e in model.transport_.transcript]
    for party in model.parties_:
        m = party.model
        for threshold in m.threshold[np.isfinite(m.threshold)]:
            if not float(threshold * 2).is_integer():
                assert not any(np.float64(threshold).tobytes() in blob for blob in blobs)
    for label in ("class_0", "class_1", "class_2"):
        assert not any(label.encode() in blob for blob in blobs)


def test_a_tampered_split_choice_is_refused(key) -> None:
    table = mixed_table(n_rows=200, seed=21, n_classes=3)
    parties = split_vertical(table, 2, label="target", seed=7, label_party=0)
    model = FederatedForestClassifier(n_estimators=2, max_depth=4, privacy=scheme_for(key.public).mode,
                                      label_key=key)
    original = model.fit(parties, label="target").transport_  # a first fit works

    class Tamper:
        def __init__(self, inner):
            self.inner = inner
            self.tampered = 0

        def __call__(self, message):
            if message.kind == "apply_splits" and "choice" in message.arrays:
                message.arrays["choice"] = message.arrays["choice"].copy()
                message.arrays["choice"][0, 0] ^= 1
                self.tampered += 1
            return self.inner(message)

    passive = next(p for p in model.parties_ if not p.is_label_holder)
    tamper = original._handlers[passive.name] = Tamper(passive.handle)
    model.master_.info = None
    with pytest.raises(ProtocolError, match=r"a sealed message from '.*' failed authentication"):
        model.master_.fit()
    assert tamper.tampered == 1


def test_bad_privacy_settings_are_named() -> None:
    parties = split_vertical(mixed_table(n_rows=40), 2, label="target")
    with pytest.raises(ParameterError, match=r"algorithm 'forest' supports privacy \['none', 'paillier', "
                                             r"'ou'\], got 'ldp'"):
        FederatedForestClassifier(privacy="ldp").fit(parties, label="target")
    for mode in ("paillier", "ou"):
        with pytest.raises(ParameterError,
                           match=rf"key_bits must be one of \(2048, 3072\) for privacy '{mode}' "
                                 r"\(.* modulus sizes\), got 1024"):
            FederatedForestClassifier(privacy=mode, key_bits=1024).fit(parties, label="target")
    with pytest.raises(ParameterError, match=r"privacy: mode 'none' does not use field\(s\) \['key_bits'\]; "
                                             r"valid: \['mode'\]"):
        FederatedForestClassifier(key_bits=2048).fit(parties, label="target")


def test_class_zero_is_the_total_weight_minus_the_encrypted_classes() -> None:
    y = np.array([0, 1, 2, 1, 0], dtype=float)
    encoding, values = TargetEncoding.for_labels(y, criterion=0, n_classes=3)
    assert values.tolist() == [[0, 0], [1, 0], [0, 1], [1, 0], [0, 0]]  # classes 1 and 2 only
    # 2 of class 1, 1 of class 2, 5 rows
    statistics = encoding.statistics(np.array([[2, 1, 5]], dtype=object))
    assert statistics.tolist() == [[2.0, 2.0, 1.0]]


def test_worker_processes_grow_the_same_forest(key, monkeypatch) -> None:
    """Bin sums and label encryption over two worker processes still grow exactly the plain forest.

    That is what a large table gets on a multi-core machine, forced here for a small one.
    """
    from fedcore.privacy import gmp_workers

    monkeypatch.setattr(gmp_workers, "MIN_ROWS", 1)
    monkeypatch.setattr(gmp_workers.os, "cpu_count", lambda: 2)
    cls, table_args, n_parties, params = CASES["3 classes, 3 parties, unlimited depth"]
    plain, encrypted, _ = _pair(cls, mixed_table(n_rows=240, seed=11, **table_args), n_parties, key, **params)
    _assert_same_forest(plain, encrypted)
    passive = [p._passive_crypto for p in encrypted.parties_ if not p.is_label_holder]
    assert all(c.pool is not None and c.pool.count == 2 for c in passive)
    for crypto in passive:
        crypto.close()
        assert all(process.poll() is not None for process in crypto.pool.processes)


def test_a_label_key_of_another_scheme_than_the_mode_is_refused(key) -> None:
    other = next(mode for mode in ENCRYPTED_MODES if mode != scheme_for(key.public).mode)
    parties = split_vertical(mixed_table(n_rows=40), 2, label="target")
    with pytest.raises(ProtocolError,
                       match=rf"the master asks for privacy '{other}'; this party's label key is "
                             rf"'{scheme_for(key.public).mode}'"):
        FederatedForestClassifier(n_estimators=1, privacy=other, label_key=key).fit(parties, label="target")


@pytest.mark.parametrize("copies_in_budget", [10, 1])
def test_a_passive_party_plans_its_label_powers_inside_its_memory_budget(key, monkeypatch,
                                                                          copies_in_budget) -> None:
    """The powers' share comes off the budget the party reports for tree batches; workers fit the share."""
    from fedcore.privacy import gmp_workers
    from fedcore.privacy.packing import weight_powers_bytes
    from fedcore.vertical import party as party_module

    monkeypatch.setattr(gmp_workers, "MIN_ROWS", 1)
    monkeypatch.setattr(gmp_workers.os, "cpu_count", lambda: 2)
    mode = scheme_for(key.public)
    asked = weight_powers_bytes(mode.ciphertext_bytes(mode.default_key_bits), 240)  # the master's key size
    budget = copies_in_budget * asked
    monkeypatch.setattr(party_module, "default_budget", lambda: budget)
    parties = split_vertical(mixed_table(n_rows=240, seed=11), 2, label="target", seed=7, label_party=0)
    model = FederatedForestClassifier(n_estimators=2, max_depth=3, privacy=mode.mode, label_key=key,
                                      record_payloads=True).fit(parties, "target")
    passive = next(p for p in model.parties_ if not p.is_label_holder)
    reply = next(Message.from_bytes(e.payload) for e in model.transcript_
                 if e.kind == "setup_reply" and e.sender == passive.name)
    share = min(2 * asked, max(budget // 2, asked))  # a copy per worker, at most half, at least one copy
    assert reply.header["memory_budget"] == max(budget - share, 1)  # 0 would read as "none reported"
    fit = share // weight_powers_bytes(key.public.ciphertext_bytes, 240)  # copies of the key it got
    pool = passive._passive_crypto.pool
    assert (pool.count if pool is not None else 0) == (min(fit, 2) if fit > 1 else 0)
    passive._passive_crypto.close()
