"""PPD-ERT's data-following thresholds (`thresholds="histogram"`, fedcore/horizontal/ppdert/cells.py).

The grid arithmetic, the spans, the boxes the children inherit, accuracy on skewed columns, and what a party
refuses.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal import PPDERTClassifier
from fedcore.horizontal.boxes import NodeBoxes, span_thresholds
from fedcore.horizontal.ppdert.agreed import candidate_draws
from fedcore.horizontal.ppdert.cells import (
    NO_CELL,
    cell_multipliers,
    cell_of,
    extreme_cell_indicators,
    populated_cells,
    populated_spans,
)
from fedcore.horizontal.ppdert.master import PPDERTMaster
from fedcore.horizontal.ppdert.party import PPDERTParty
from fedcore.horizontal.validation import build_schema, resolve_feature_ranges
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from tests.horizontal.common import horizontal_table, split_rows


def test_the_span_of_the_populated_cells_holds_every_value_and_at_most_one_cell_more_on_each_side() -> None:
    rng = np.random.default_rng(0)
    n_cells = 16
    grid_low, grid_high = rng.uniform(-5, 0, (50, 3)), rng.uniform(0.5, 5, (50, 3))
    parties = []
    for _ in range(3):  # each party's values of each candidate, inside the candidate's interval
        values = grid_low[..., None] + rng.beta(0.3, 2.0, (50, 3, 20)) * (grid_high - grid_low)[..., None]
        parties.append(values)
    pooled = np.concatenate(parties, axis=-1)
    total = sum(extreme_cell_indicators(v.min(axis=-1), v.max(axis=-1), grid_low, grid_high, n_cells)
                .astype(np.int64) for v in parties)
    span_low, span_high, has = populated_spans(*populated_cells(total, n_cells), grid_low, grid_high, n_cells)
    assert has.all()
    width = (grid_high - grid_low) / n_cells
    assert np.all(span_low <= pooled.min(axis=-1)) and np.all(pooled.max(axis=-1) <= span_high)
    assert np.all(pooled.min(axis=-1) - span_low < width * (1 + 1e-12))
    assert np.all(span_high - pooled.max(axis=-1) < width * (1 + 1e-12))


def test_a_node_without_values_has_no_span_and_no_usable_candidate() -> None:
    low, high = np.array([[np.inf, 1.0]]), np.array([[-np.inf, 3.0]])  # candidate 0: only NaN in the node
    indicators = extreme_cell_indicators(low, high, np.zeros((1, 2)), np.full((1, 2), 4.0), 8)
    assert not indicators[0, 0].any()
    first, last = populated_cells(indicators, 8)
    assert (first.tolist(), last.tolist()) == ([[NO_CELL, 2]], [[NO_CELL, 6]])
    span_low, span_high, has = populated_spans(first, last, np.zeros((1, 2)), np.full((1, 2), 4.0), 8)
    assert has.tolist() == [[False, True]]
    assert (span_low[0, 1], span_high[0, 1]) == (1.0, 3.5)  # cells 2..6 of eight half-unit cells
    thresholds, valid = span_thresholds(span_low, span_high, has, np.array([[0.5, 0.5]]))
    assert np.isnan(thresholds[0, 0]) and not valid[0, 0]
    assert thresholds[0, 1] == 2.25 and valid[0, 1]


def test_values_outside_the_interval_fall_in_the_end_cells() -> None:
    cells = cell_of(np.array([-10.0, 0.0, 0.49, 0.5, 1.0, 99.0]), np.zeros(6), np.ones(6), 4)
    assert cells.tolist() == [0, 0, 1, 2, 3, 3]
    assert cell_of(np.array([2.0]), np.array([2.0]), np.array([2.0]), 4).tolist() == [0]  # a point interval


def test_children_inherit_the_box_cut_at_the_split() -> None:
    boxes = NodeBoxes.roots(np.array([0.0, 10.0]), np.array([1.0, 20.0]), 2)
    boxes.narrow(np.array([[1], [0]]), np.array([[12.0], [0.25]]), np.array([[15.0], [0.5]]),
                 np.ones((2, 1), bool))
    children = boxes.split(np.array([0, 1]), np.array([1, 0]), np.array([13.0, 0.3]), np.array([0, 1, -1, 2]))
    expected = [
        [[0.0, 1.0], [12.0, 13.0]],  # node 0, left: feature 1 cut above at 13
        [[0.0, 1.0], [13.0, 15.0]],  # node 0, right
        [[0.3, 0.5], [10.0, 20.0]],  # node 1, right (its left child closed): feature 0 cut below at 0.3
    ]
    np.testing.assert_array_equal(children.boxes, expected)
    # the open nodes numbered in another order: each box goes where next_pos puts its child
    permuted = boxes.split(np.array([0, 1]), np.array([1, 0]), np.array([13.0, 0.3]), np.array([2, 0, -1, 1]))
    np.testing.assert_array_equal(permuted.boxes, [expected[1], expected[2], expected[0]])
    # a party derives the same from the decisions it receives (chosen candidate per node)
    features, thresholds = np.array([[0, 1], [0, 1]]), np.array([[0.9, 13.0], [0.3, 11.0]])
    np.testing.assert_array_equal(
        boxes.after_decisions(np.array([1, 0]), np.array([2, 0, -1, 1]), features, thresholds).boxes,
        permuted.boxes)
    closed = boxes.split(np.array([0]), np.array([1]), np.array([13.0]), np.array([-1, -1]))
    assert closed.boxes.shape == (0, 2, 2)  # both children leaves: no open node


def _skewed(seed: int, n_rows: int = 1500) -> pd.DataFrame:
    """Heavy-tailed columns whose class signal sits in the bulk near zero, far below the declared maxima."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n_rows)
    columns = {f"x{i}": np.exp(rng.normal(0.0, 1.5, n_rows) + 1.5 * (y == i % 3)) for i in range(6)}
    return pd.DataFrame({**columns, "target": y})


def test_histogram_thresholds_learn_skewed_columns_the_domain_draw_wastes() -> None:
    train, test = _skewed(1), _skewed(2)
    options = {"n_estimators": 30, "random_state": 3, "allow_data_ranges": True}
    accuracy = {}
    for mode in ("domain", "histogram"):
        model = PPDERTClassifier(**options, thresholds=mode).fit(split_rows(train, 3), label="target")
        predicted = model.predict(test.drop(columns=["target"]))
        accuracy[mode] = float(np.mean(predicted == test["target"].to_numpy()))
    # the signal: the bulk of each column, an order of magnitude below its maximum; a draw over the whole
    # domain rarely lands there, a draw within the populated cells does at every depth
    assert accuracy["histogram"] > accuracy["domain"] + 0.05, accuracy


def _parties(thresholds: str = "histogram", n_cells: int = 16):
    table = horizontal_table(seed=4, n_rows=300)
    frames = dict(zip(["a", "b"], split_rows(table, 2), strict=True))
    schema = build_schema(frames, "target", "classification")
    low, high, _ = resolve_feature_ranges(schema, None, frames, allow_data_ranges=True)
    parties = {name: PPDERTParty(name, frame, schema, seed=1, low=low, high=high, k=3, secure=False,
                                 thresholds=thresholds, n_cells=n_cells) for name, frame in frames.items()}
    return parties, schema, low, high


def _master(schema, low, high, parties, **options):
    from fedcore.horizontal.params import ExtraTreesParams

    params = ExtraTreesParams(n_estimators=2, max_depth=3, random_state=1, max_features=3)
    return PPDERTMaster(InProcessTransport({n: p.handle for n, p in parties.items()}), params,
                        schema, low=low, high=high, secure=False, **options)


def test_a_party_refuses_a_master_that_asks_for_another_threshold_mode_or_grid() -> None:
    parties, schema, low, high = _parties("domain")
    with pytest.raises(ProtocolError, match="party 'a' agreed to 'domain' thresholds; the master asked for "
                                            "'histogram' on 16 cells"):
        _master(schema, low, high, parties, thresholds="histogram").fit()
    parties, schema, low, high = _parties("histogram", 16)
    with pytest.raises(ProtocolError,
                       match="party 'a' agreed to 'histogram' thresholds on 16 cells; the master "
                             "asked for 'histogram' on 32 cells"):
        _master(schema, low, high, parties, thresholds="histogram", n_cells=32).fit()


_N_FEATURES = len(horizontal_table(seed=4, n_rows=10).columns) - 1


def _greeted(thresholds: str = "histogram"):
    parties, schema, low, high = _parties(thresholds)
    party = parties["a"]
    hello = {"algorithm": "ppd-ert", "schema": schema.fingerprint(), "k": 3, "n_parties": 1, "secure": False,
             "session_id": "00" * 16, "thresholds": thresholds, "n_cells": 16}
    from fedcore.horizontal.ppdert.agreed import domain_fingerprint

    hello["domains"] = domain_fingerprint(low, high)
    assert party.handle(Message("hello", hello)).kind == "hello_reply"
    return party, low, high


def _cells_request(low, high, n_trees: int = 2) -> Message:
    """A root level's cells request, as the master sends it: each candidate's declared domain."""
    features, _ = candidate_draws(1, np.arange(n_trees), 0, len(low), 3)
    return Message("ppdert_cells",
                   {"depth": 0, "n_trees": n_trees, "new_batch": True, "n_cells": 16, "round_id": 1,
                    "mask_bits": 64},
                   {"tree": np.arange(n_trees, dtype=np.int32), "grid_low": low[features],
                    "grid_high": high[features]})


def _counts_request(first: np.ndarray, last: np.ndarray) -> Message:
    return Message("ppdert_counts", {"depth": 0, "round_id": 2, "mask_bits": 16},
                   {"first_cell": first.astype(np.uint8), "last_cell": last.astype(np.uint8)})


def test_a_party_places_the_thresholds_itself_from_the_populated_cells() -> None:
    party, low, high = _greeted()
    request = _cells_request(low, high)
    reply = party.handle(request)
    assert reply.kind == "ppdert_plain_cells" and reply.arrays["cells"].shape == (2 * 3 * 2 * 16,)
    first, last = np.full((2, 3), 2), np.full((2, 3), 9)
    for bad_first, bad_last in ((first, last + 7), (last, first), (first, np.where(first == 2, NO_CELL, 9))):
        with pytest.raises(ProtocolError,
                           match=r"party 'a': the populated cells must be first <= last < 16 \(or "
                                 r"both 255\) for each of the level's \(2, 3\) candidates"):
            party.handle(_counts_request(bad_first, bad_last))
        assert party.machine.state == "celled"  # refused: the level is still waiting for its cells
    assert party.handle(_counts_request(first, last)).kind == "ppdert_plain_counts"
    _, u = candidate_draws(1, np.arange(2), 0, _N_FEATURES, 3)
    grid_low, grid_high = request.arrays["grid_low"], request.arrays["grid_high"]
    lower = grid_low + (grid_high - grid_low) * 2 / 16
    upper = grid_low + (grid_high - grid_low) * 10 / 16
    np.testing.assert_allclose(party.rows.thresholds, lower + u * (upper - lower), rtol=1e-12)


def test_a_refused_cells_request_leaves_the_party_where_it_was() -> None:
    party, low, high = _greeted()
    request = _cells_request(low, high)
    shifted = Message(request.kind, dict(request.header), dict(request.arrays))
    shifted.arrays["grid_low"] = request.arrays["grid_low"] - 1.0  # not the declared domain at the roots
    with pytest.raises(ProtocolError,
                       match="party 'a': a tree's root grid must be the declared domain of each "
                             "candidate feature"):
        party.handle(shifted)
    assert party.machine.state == "greeted" and party.handle(request).kind == "ppdert_plain_cells"


def test_a_party_refuses_a_deeper_grid_narrower_than_the_nodes_box() -> None:
    """A master that halves each child's box would learn in which half of it the parties' values lie."""

    class Probing(PPDERTMaster):
        def advance(self, level, split_idx, left, child_open, next_pos) -> None:
            super().advance(level, split_idx, left, child_open, next_pos)
            boxes = self._boxes  # every box halved: narrowed to its lower half on every feature
            every = np.broadcast_to(np.arange(len(boxes.low)), (boxes.n_open, len(boxes.low)))
            low, high = boxes.grid(every)
            boxes.narrow(every, low, low / 2 + high / 2, np.ones(every.shape, bool))

    parties, schema, low, high = _parties()
    honest = _master(schema, low, high, parties)
    honest.fit()  # the parties derive the same boxes as an honest master, level after level
    parties, schema, low, high = _parties()
    probing = Probing(InProcessTransport({n: p.handle for n, p in parties.items()}), honest.params, schema,
                      low=low, high=high, secure=False)
    with pytest.raises(ProtocolError,
                       match="party 'a': a node's grid must be its box on each candidate feature .* a "
                             "narrower grid would locate the parties' values more finely"):
        probing.fit()
    refused = parties["a"]
    assert refused.machine.state == "counted" and refused.rows.partition.n_open == 2  # the two roots:
    # refused before the depth-0 decisions were applied


def test_a_party_refuses_deeper_cells_before_a_batch_or_with_children_numbered_with_gaps() -> None:
    party, low, high = _greeted()
    root = _cells_request(low, high)
    decisions = {"chosen": np.array([0, 0], np.int32), "next_pos": np.array([0, -1, 2, -1], np.int32)}
    deeper = Message("ppdert_cells", {**root.header, "new_batch": False, "depth": 1},
                     {**root.arrays, **decisions})
    with pytest.raises(ProtocolError, match="party 'a': a level of a tree batch that was never started"):
        party.handle(deeper)
    party.handle(root)
    party.handle(_counts_request(np.full((2, 3), 2), np.full((2, 3), 9)))
    with pytest.raises(ProtocolError, match="party 'a': the request covers 2 open nodes; the previous "
                                            "level's decisions must number its open children 0 to n - 1"):
        party.handle(deeper)
    assert party.machine.state == "counted" and party.rows.partition.n_open == 2  # nothing applied


def test_the_master_cannot_count_parties_from_the_low_bits_of_the_cell_sums() -> None:
    """Two parties hold every cell.

    Each sum is two secret multiples, uniform in the ring. Odd multipliers would make every such sum even (the
    count of parties, modulo 2).
    """
    low, high = np.zeros((1250, 1)), np.full((1250, 1), 8.0)  # every cell of 1,250 candidates is held

    def hidden(secret: bytes) -> np.ndarray:
        return extreme_cell_indicators(low, high, low, high, 8, cell_multipliers(secret, 1, 1250 * 2 * 8))

    total = hidden(b"a" * 32) + hidden(b"b" * 32)
    assert 0.48 < np.mean(total % 2) < 0.52  # 20,000 fair coins: 0.5 +- 0.0035 (1 sd)
    assert np.all(hidden(b"a" * 32) != 0)
    words = np.maximum(cell_multipliers(b"a" * 32, 1, 20000), 1)
    assert np.array_equal(hidden(b"a" * 32), words.reshape(1250, 1, 2, 8))


def test_histogram_thresholds_train_on_the_widest_finite_domains() -> None:
    table = horizontal_table(seed=2, n_rows=300)
    table["num0"] = np.where(np.arange(300) % 2 == 0, -1e308, 1e308) * np.random.default_rng(0).random(300)
    model = PPDERTClassifier(3, allow_data_ranges=True, max_depth=4, random_state=1).fit(split_rows(table, 2),
                                                                                         "target")
    assert np.all(np.isfinite(model.model_.threshold[model.model_.feature >= 0]))


def test_a_party_refuses_a_grid_that_is_not_finite_intervals_and_a_domain_party_refuses_cells() -> None:
    party, low, high = _greeted()
    request = _cells_request(low, high)
    request.arrays["grid_low"] = request.arrays["grid_high"] + 1.0
    with pytest.raises(ProtocolError,
                       match=r"party 'a': the grid must be finite intervals of shape \(2, 3\)"):
        party.handle(request)
    domain_party, low, high = _greeted("domain")
    with pytest.raises(ProtocolError,
                       match="party 'a' refuses 'ppdert_cells': in the PPD-ERT protocol only a party "
                             "in role histogram answers it, this party is domain"):
        domain_party.handle(_cells_request(low, high))


def test_the_estimator_refuses_unknown_modes_and_grids() -> None:
    frames = split_rows(horizontal_table(seed=4, n_rows=40), 2)
    with pytest.raises(ParameterError, match=r"PPD-ERT thresholds must be one of \['histogram', 'domain'\], "
                                             r"got 'quantile'"):
        PPDERTClassifier(allow_data_ranges=True, thresholds="quantile").fit(frames, "target")
    with pytest.raises(ParameterError,
                       match=r"PPD-ERT histogram cells must be one of \[4, 8, 16, 32, 64\], got 10"):
        PPDERTClassifier(allow_data_ranges=True, threshold_cells=10).fit(frames, "target")


def test_an_agent_runs_the_threshold_mode_of_its_own_config_and_refuses_a_master_asking_otherwise(
        tmp_path) -> None:
    from fedcore.agents.data import InstitutionData
    from fedcore.contracts.model import infer_contract
    from fedcore.horizontal.agent import HorizontalInstitutionAgent
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.horizontal.session import HorizontalSession
    from fedcore.privacy.keyauth import ephemeral_identities

    table = horizontal_table(seed=6, n_rows=200).assign(record_id=[f"R{i}" for i in range(200)])
    contract = infer_contract(table, "own", id_column="record_id", label="target")
    names = ("north", "south")
    identities = ephemeral_identities(names)

    def agents(own: dict | None) -> dict:
        return {name: HorizontalInstitutionAgent(InstitutionData(
            name=name, frame=part.reset_index(drop=True), id_column="record_id", label="target",
            registry=tmp_path / name, predictions_dir=tmp_path / "p" / name, contract=contract, privacy=own),
            identity=identities[name]) for name, part in zip(names, split_rows(table, 2), strict=True)}

    def train(agents_: dict, master_privacy: dict) -> None:
        transport = InProcessTransport({n: a.handle for n, a in agents_.items()})
        transport.exchange({n: Message("validation_report") for n in agents_})
        session = HorizontalSession(transport, ExtraTreesParams(n_estimators=2, max_depth=3),
                                    algorithm="ppd-ert", privacy=master_privacy)
        session.agree_schema()
        session.train()

    own = {"mode": "secagg", "thresholds": "domain"}
    with pytest.raises(ProtocolError,
                       match=r"institution 'north': the master asks for privacy 'secagg' \(histogram "
                             r"thresholds on 16 cells\), but this institution's configuration says 'secagg' "
                             r"\(domain thresholds\); refusing to train"):
        train(agents(own), {"mode": "secagg", "thresholds": "histogram"})
    train(agents(own), {"mode": "secagg", "thresholds": "domain"})
    # no own config (in-process): the master's
    train(agents(None), {"mode": "secagg", "thresholds": "histogram"})


def test_a_box_replays_its_path_cuts_and_narrowings_in_order() -> None:
    """A box is the domain narrowed and cut along its path in order: a later narrowing replaces an earlier."""
    boxes = NodeBoxes.roots(np.array([0.0, 10.0, 5.0]), np.array([1.0, 20.0, 5.0]), 1)
    assert boxes.drawn(np.array([0.99]))[0].tolist() == [1]  # a point domain is never usable: 2 of 3 are
    boxes.narrow(np.array([[0]]), np.array([[0.25]]), np.array([[0.75]]), np.ones((1, 1), bool))
    boxes.narrow(np.array([[0, 1]]), np.array([[0.5, 0.0]]), np.array([[0.6, 99.0]]),
                 np.array([[True, False]]))
    children = boxes.split(np.array([0]), np.array([0]), np.array([0.5]), np.array([0, 1]))
    np.testing.assert_array_equal(children.boxes, [[[0.5, 0.5], [10.0, 20.0], [5.0, 5.0]],
                                                   [[0.5, 0.6], [10.0, 20.0], [5.0, 5.0]]])
    features, low, high = children.drawn(np.array([0.0, 0.0]))  # the first usable feature of each
    assert features.tolist() == [1, 0] and low.tolist() == [10.0, 0.5] and high.tolist() == [20.0, 0.6]
    low, high = children.grid(np.array([[1, 0], [0, 0]]))
    assert low.tolist() == [[10.0, 0.5], [0.5, 0.5]] and high.tolist() == [[20.0, 0.5], [0.6, 0.6]]
    np.testing.assert_array_equal(boxes.boxes, [[[0.5, 0.6], [10.0, 20.0], [5.0, 5.0]]])  # the parent's kept


def test_a_refused_child_and_a_late_narrowing_leave_the_other_boxes_alone() -> None:
    """Appended in place, yet a level split twice or narrowed after a child was made keeps each one's view.

    As copies would: a party's refused request leaves a child it drops, and a retried one splits again.
    """
    boxes = NodeBoxes.roots(np.array([0.0, 10.0]), np.array([1.0, 20.0]), 1)
    refused = boxes.split(np.array([0]), np.array([0]), np.array([0.5]), np.array([0, 1]))
    boxes.narrow(np.array([[1]]), np.array([[12.0]]), np.array([[14.0]]), np.ones((1, 1), bool))
    kept = boxes.split(np.array([0]), np.array([1]), np.array([13.0]), np.array([-1, 0]))
    np.testing.assert_array_equal(refused.boxes, [[[0.0, 0.5], [10.0, 20.0]], [[0.5, 1.0], [10.0, 20.0]]])
    np.testing.assert_array_equal(kept.boxes, [[[0.0, 1.0], [13.0, 14.0]]])
    refused.narrow(np.array([[1], [1]]), np.array([[11.0], [15.0]]), np.array([[12.0], [16.0]]),
                   np.ones((2, 1), bool))
    np.testing.assert_array_equal(kept.boxes, [[[0.0, 1.0], [13.0, 14.0]]])
    np.testing.assert_array_equal(refused.boxes, [[[0.0, 0.5], [11.0, 12.0]], [[0.5, 1.0], [15.0, 16.0]]])


def test_roles_in_one_process_draw_a_level_once_and_each_gets_its_own_copy(monkeypatch) -> None:
    from fedcore.horizontal.ppdert import agreed

    streams: list[tuple] = []
    real = agreed.stream
    monkeypatch.setattr(agreed, "stream", lambda *args: streams.append(args) or real(*args))
    trees = np.array([0, 0, 1, 2, 2, 2])
    features, u = candidate_draws(5, trees, 3, _N_FEATURES, 3)
    assert len(streams) == 3  # one stream per tree of the level
    again_features, again_u = candidate_draws(5, trees.astype(np.int32), 3, _N_FEATURES, 3)
    assert len(streams) == 3  # the same level, asked by another role: not drawn again
    np.testing.assert_array_equal(again_features, features)
    np.testing.assert_array_equal(again_u, u)
    again_features[0, 0] = -1  # a role's copy is its own
    assert candidate_draws(5, trees, 3, _N_FEATURES, 3)[0][0, 0] == features[0, 0]
    other, _ = candidate_draws(5, np.array([0, 0, 1, 2, 2, 3]), 3, _N_FEATURES, 3)  # another level
    assert len(streams) == 7  # its four trees drawn
    np.testing.assert_array_equal(other[:5], features[:5])  # the same trees' streams, the same draws


def test_parties_answering_side_by_side_share_the_draws_and_grow_the_same_forest(monkeypatch) -> None:
    """Threads of one process ask for a level's draws together (`InProcessTransport(concurrent=True)`)."""
    from fedcore.horizontal.ppdert import agreed

    monkeypatch.setattr("fedcore.transport.inprocess.kernels_threadsafe", lambda: True)
    frames = split_rows(horizontal_table(seed=5, n_rows=400), 3)
    options = {"n_estimators": 6, "random_state": 2, "allow_data_ranges": True}
    in_turn = PPDERTClassifier(**options).fit(frames, "target").model_
    agreed._RECENT.clear()
    monkeypatch.setattr(PPDERTClassifier, "_concurrent_parties", True)
    side_by_side = PPDERTClassifier(**options).fit(frames, "target")
    assert side_by_side.transport_.concurrent
    for field in ("feature", "threshold", "left", "right", "value"):
        np.testing.assert_array_equal(getattr(side_by_side.model_, field), getattr(in_turn, field))
