"""Vertical SecureBoost (issue #32): encrypted (g, h) give the plain and the one-party model, byte for byte.

Under Okamoto-Uchiyama and Paillier (small test keys), 2 and 3 parties; and on the recorded transcript, no
plaintext gradient or hessian reaches a passive party or the master: the label holder's rounds cross as
ciphertexts only, and no message (bytes included) carries a run of the round's plain values. A round that is
not one ciphertext per row and tree is refused; worker processes sum a round's ciphertexts as the party does.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import ProtocolError
from fedcore.privacy.keyauth import ephemeral_identities
from fedcore.privacy.packing import SlotLayout, encrypted_bin_sums, weight_powers
from fedcore.privacy.schemes import scheme
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.boosting import BoostingParams
from fedcore.vertical.encrypted import PassiveCrypto
from fedcore.vertical.master import VerticalMaster
from fedcore.vertical.party import VerticalParty
from tests.conftest import mixed_table
from tests.vertical.test_boosting import PARAMS, _fit, _model_bytes

KEYS: dict = {}


def _key(mode: str):
    """One small test key per scheme for the module (generation is the slow part)."""
    if mode not in KEYS:
        KEYS[mode] = scheme(mode).generate(1024, insecure_for_tests=True)
    return KEYS[mode]


CASES = {  # loss, scheme, rounds: softmax's K trees a round cost K encryptions a row, so fewer rounds
    "squared error, ou": ("squared error", "ou", 4),
    "logistic, ou": ("logistic", "ou", 4),
    "softmax, ou": ("softmax", "ou", 2),
    "logistic, paillier": ("logistic", "paillier", 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_encrypted_gradients_grow_the_plain_and_single_party_model(case: str) -> None:
    loss, mode, rounds = CASES[case]
    single = _model_bytes(*_fit(loss, 1, n_estimators=rounds)[:2])
    assert _model_bytes(*_fit(loss, 2, n_estimators=rounds)[:2]) == single  # plain
    for n_parties in (2, 3):
        model, frames, _ = _fit(loss, n_parties, n_estimators=rounds, privacy=mode, label_key=_key(mode))
        assert _model_bytes(model, frames) == single
        passive = [p for p in model.parties_ if not p.is_label_holder]
        assert all(p._passive_crypto is not None and p._passive_crypto.per_tree for p in passive)


def _runs(values: np.ndarray, width: int = 6) -> list[bytes]:
    """Byte strings of `width` consecutive non-zero values of a column: what a leak would carry."""
    nonzero = np.flatnonzero(np.convolve(values != 0, np.ones(width), "valid") == width)
    every = max(len(nonzero) // 5, 1)
    return [np.ascontiguousarray(values[i:i + width]).tobytes() for i in nonzero[::every]]


def test_no_plaintext_gradient_reaches_a_passive_party_or_the_master() -> None:
    plain = _fit("logistic", 3, record_payloads=True)[0]
    encrypted, _, table = _fit("logistic", 3, record_payloads=True, privacy="ou", label_key=_key("ou"))
    holder = encrypted.label_holder_.name
    # the plain run's rounds: what the label holder would have sent (the same (g, h): the models are equal)
    rounds = [Message.from_bytes(e.payload).arrays["gh"] for e in plain.transcript_
              if e.receiver == "master" and "gh" in Message.from_bytes(e.payload).arrays]
    assert len(rounds) == PARAMS["n_estimators"]
    leaks = [run for gh in rounds for column in (gh[:, 0], gh[:, 1], gh.ravel()) for run in _runs(column)]
    assert len(leaks) >= 3 * len(rounds)
    plain_holder = plain.label_holder_.name
    found = [e for e in plain.transcript_
             if e.receiver != plain_holder and any(r in e.payload for r in leaks)]
    assert len(found) == 3 * len(rounds)  # the check sees plain mode's: holder -> master -> 2 passive parties
    seen_rounds = 0
    for entry in encrypted.transcript_:
        message = Message.from_bytes(entry.payload)
        if entry.receiver == holder:
            continue  # what the label holder itself receives is not at stake
        assert not any(run in entry.payload for run in leaks), (entry.sender, entry.receiver, message.kind)
        assert "gh" not in message.arrays and "y" not in message.arrays and "stats" not in message.arrays \
            or entry.sender == holder  # the holder's own node statistics go to the master, as in plain mode
        if "enc_gh" in message.arrays:  # the label holder's answer to begin_batch, relayed in the others'
            assert message.kind in ("local_best", "begin_batch")
            seen_rounds += message.kind == "local_best"
            assert set(message.arrays) == ({"enc_gh", "gain", "rank", "stats"} if message.kind == "local_best"
                                           else {"enc_gh", "feat_ptr", "feat_global", "feat_rank"})
            assert message.arrays["enc_gh"].dtype == np.uint8
            assert message.arrays["enc_gh"].shape == (len(table), scheme("ou").ciphertext_bytes(1024))
    assert seen_rounds == PARAMS["n_estimators"]
    begins = [e for e in encrypted.transcript_ if Message.from_bytes(e.payload).kind == "begin_batch"
              and e.receiver != holder]
    assert len(begins) == 2 * PARAMS["n_estimators"]
    assert all("enc_gh" in Message.from_bytes(e.payload).arrays for e in begins)


def test_worker_processes_sum_a_rounds_ciphertexts_as_the_party_does() -> None:
    """Large tables sum bins on worker processes: they reload each round's ciphertexts (`load_round`)."""
    key = _key("ou")
    public = key.public
    rng = np.random.default_rng(0)
    layout = SlotLayout(2, 40, 1 << 20, public.plaintext_bits)
    in_process = PassiveCrypto(public, layout, [], channel=None, workers=0)  # type: ignore[arg-type]
    pooled = PassiveCrypto(public, layout, [], channel=None, workers=2)  # type: ignore[arg-type]
    try:
        assert pooled.pool is not None
        for _ in range(2):  # two rounds: the second replaces the first's ciphertexts everywhere
            values = rng.integers(0, 1 << 20, size=(60, 2))
            ciphertexts = key.encrypt(layout.encode(values))
            in_process.load_round(ciphertexts)
            pooled.load_round(ciphertexts)
            rows = rng.permutation(60)[:45].astype(np.int64)
            job = (rows, np.ones(45, np.int32), rng.integers(0, 5, 45).astype(np.uint8))
            expected = encrypted_bin_sums(public, weight_powers(public, ciphertexts, largest=1), *job)
            for answer in (in_process.bin_sums([job])[0], pooled.bin_sums([job])[0]):
                assert np.array_equal(answer[0], expected[0]) and answer[2] == expected[2]
                assert key.decrypt(answer[1]) == key.decrypt(expected[1])
            bins = job[2]
            first = int(np.min(bins))
            assert key.decrypt([expected[1][0]])[0] == sum(layout.encode(values[rows[bins == first]]))
    finally:
        pooled.close()


@pytest.mark.parametrize("tamper", ["a row short", "plain (g, h)"])
def test_a_passive_party_refuses_a_round_that_is_not_one_ciphertext_per_row_and_tree(tamper: str) -> None:
    """A master that drops a row's ciphertext, or sends plain (g, h) in an encrypted session, is refused.

    Three classes: softmax, K = 3 trees a round.
    """
    frames = split_vertical(mixed_table(n_rows=80, seed=5), 2, label="target", seed=7, label_party=0)
    names = ["holder", "passive"]
    identities = ephemeral_identities(names)
    parties = {name: VerticalParty(name, frame, "target" if "target" in frame else None,
                                   feature_key=b"secure-boost-tests-feature-key-0",
                                   label_key=_key("ou") if "target" in frame else None,
                                   identity=identities[name])
               for name, frame in zip(names, frames, strict=True)}

    def passive(message: Message) -> Message:
        if message.kind == "begin_batch":
            enc_gh = message.arrays["enc_gh"]
            arrays = {name: a for name, a in message.arrays.items() if name != "enc_gh"}
            arrays.update({"enc_gh": enc_gh[:-1]} if tamper == "a row short"
                          else {"gh": np.zeros((len(enc_gh), 2))})
            message = Message("begin_batch", message.header, arrays)
        return parties["passive"].handle(message)

    params = BoostingParams(task="classification", n_estimators=1, max_depth=2, random_state=1, privacy="ou")
    transport = InProcessTransport({"holder": parties["holder"].handle, "passive": passive})
    with pytest.raises(ProtocolError) as refused:
        VerticalMaster(transport, params).fit()
    assert str(refused.value) == ("party 'passive' refuses the request: an encrypted boosting round needs "
                                  "one (g, h) ciphertext for each of its 3 trees and 80 rows")
