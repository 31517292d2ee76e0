"""Party and master refuse messages they cannot act on (wrong schema, weaker privacy, unmasked counts)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.horizontal.estimators import FederatedExtraTreesClassifier, PPDERTClassifier
from fedcore.horizontal.fet.master import FederatedExtraTreesMaster
from fedcore.horizontal.fet.party import HorizontalParty
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.validation import build_schema, resolve_feature_ranges
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from tests.horizontal.common import horizontal_table, split_rows


def _setup(privacy_party="none", privacy_master="none"):
    frames = dict(zip(["a", "b"], split_rows(horizontal_table(seed=8), 2), strict=True))
    schema = build_schema(frames, "target", "classification")
    parties = [HorizontalParty(n, f, schema, privacy=privacy_party, noise_seed=1) for n, f in frames.items()]
    transport = InProcessTransport({p.name: p.handle for p in parties})
    low, high, _ = resolve_feature_ranges(schema, None, frames, allow_data_ranges=True)
    master = FederatedExtraTreesMaster(transport, ExtraTreesParams(n_estimators=2), schema,
                                       privacy=privacy_master, low=low, high=high)
    return parties, master, schema


def test_party_refuses_a_weaker_privacy_mode() -> None:
    _, master, _ = _setup(privacy_party="gdp", privacy_master="none")
    with pytest.raises(ProtocolError,
                       match="party 'a' is configured for privacy='gdp', the master asked for 'none'"):
        master.fit()


def test_party_refuses_another_schema() -> None:
    parties, _, schema = _setup()
    header = {"algorithm": "extra-trees", "schema": "0" * 64, "privacy": "none"}
    with pytest.raises(ProtocolError, match="schema fingerprint differs"):
        parties[0].handle(Message("hello", header))
    with pytest.raises(ProtocolError, match="cannot handle message kind 'find_splits'"):
        parties[0].handle(Message("find_splits"))


def test_party_refuses_out_of_sync_decisions() -> None:
    parties, master, _ = _setup()
    master.setup()
    party = parties[0]
    party.handle(Message("fet_ranges", {"new_batch": True, "n_trees": 2, "depth": 0},
                         {"features": np.zeros((2, 3), np.int32)}))
    party.handle(Message("fet_stats", {"depth": 0}, {"thresholds": np.zeros((2, 3))}))
    with pytest.raises(ProtocolError, match="split decisions for 3 nodes"):
        party.handle(Message("fet_ranges", {"depth": 1}, {"features": np.zeros((2, 3), np.int32),
                                                           "chosen": np.zeros(3, np.int32),
                                                           "next_pos": np.zeros(6, np.int32)}))


def test_master_refuses_plain_counts_from_several_parties() -> None:
    model = PPDERTClassifier(2, max_depth=2, allow_data_ranges=True)
    frames = split_rows(horizontal_table(seed=8), 2)
    original = model._make_parties

    def leaky(frames_, schema):
        parties = original(frames_, schema)
        honest = parties[1].handle

        def handle(message):
            reply = honest(message)
            if reply.kind == "ppdert_masked_counts":
                return Message("ppdert_plain_counts", {"plain": True}, {"counts": np.zeros(3, np.int64)})
            return reply

        parties[1].handle = handle
        return parties

    model._make_parties = leaky
    with pytest.raises(ProtocolError,
                       match="party 'party1' answered 'ppdert_plain_counts'; with 2 parties only "
                             "ppdert_masked_counts masked in the agreed 16-bit ring is accepted"):
        model.fit(frames, "target")


def test_communication_stats_are_reported() -> None:
    model = FederatedExtraTreesClassifier(3, max_depth=3).fit(split_rows(horizontal_table(seed=8), 2),
                                                              "target")
    stats = model.communication_
    assert stats["rounds"] == 2 + 2 * 3
    assert set(stats["by_kind"]) == {"hello", "hello_reply", "fet_ranges", "fet_ranges_reply", "fet_stats",
                                     "fet_counts", "model", "ack"}
    assert stats["bytes"] == sum(v["bytes"] for v in stats["by_kind"].values())


def test_progress_bar_reports_levels(capsys) -> None:
    FederatedExtraTreesClassifier(3, max_depth=2, progress=True).fit(split_rows(horizontal_table(seed=8), 2),
                                                                     "target")
    err = capsys.readouterr().err
    assert "trees 3/3" in err and "level 1" in err
