"""The master refuses label statistics no party could hold, naming the party (issue #27, point 8).

Party 'b' is hostile: its replies pass through an alteration (negative counts, counts above its rows,
branches that do not add up to their node, a node that is not its parent's branch) before they reach the
master. Every mode where a check applies: FET `none` (classification and regression), `ldp` (branch sizes and
bit sums), `gdp` (finite, within the largest noise), PPD-ERT without masks (per party) and with secure
aggregation (the unmasked sum: no party can be named). Small forests, refused at the first or second level.

The bounds come from what the master knows, never from the bounded party's own word: under `gdp` the agreed
epsilon (every hello must state it), and for regression targets a `y_exponent` within a label's range, within
its contract's label range, and at most 12 powers of two above every other party's; in the estimators and in
a federation (`HorizontalSession`, its configured setting and the institutions' contracts).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.counts import SUM_OF_PARTIES
from fedcore.horizontal.estimators import (
    FederatedExtraTreesClassifier,
    FederatedExtraTreesRegressor,
    PPDERTClassifier,
)
from fedcore.horizontal.fet.master import FederatedExtraTreesMaster
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.plan import count_reach, gaussian_plan, gdp_terms
from fedcore.horizontal.validation import build_schema
from fedcore.privacy.accounting import GAUSSIAN_NOISE_BOUND
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from tests.horizontal.common import horizontal_table, split_rows

OPTIONS = {"n_estimators": 2, "max_depth": 3, "max_features": 3, "random_state": 0}
DP = {**OPTIONS, "allow_data_ranges": True}
"""FET's DP modes draw thresholds in declared domains: here the pooled rows'."""
K, C = 3, 3  # candidates per node, classes


def _frames(task: str = "classification") -> dict:
    return dict(zip("ab", split_rows(horizontal_table(seed=8, task=task, n_rows=200), 2), strict=True))


ROWS = len(_frames()["b"])  # the hostile party's rows
TOTAL = 200
N_FEATURES = len(_frames()["a"].columns) - 1  # every column but the label


def _fit(model, alter: Callable[[list, Message, Message], Message], task: str = "classification") -> None:
    """Fit `model` with party 'b' passing every reply through alter(parties, request, reply)."""
    original = model._make_parties

    def make(frames, schema):
        parties = original(frames, schema)
        hostile = parties[-1]
        honest = hostile.handle
        hostile.handle = lambda message: alter(parties, message, honest(message))
        return parties

    model._make_parties = make
    model.fit(_frames(task), "target")


def _altering(kind: str, field: str, depth: int, change: Callable[[np.ndarray], None]):
    """An alteration of array `field` of `kind` replies at `depth`, seen as (nodes, k, 2, stats) int64."""
    def alter(parties, message, reply):
        if reply.kind != kind or message.header.get("depth") != depth:
            return reply
        sent = reply.arrays[field]
        c = sent.astype(np.int64)
        c = c[..., None] if field == "sizes" else c.reshape(-1, K, 2, C) if c.ndim == 1 else c
        change(c)
        return Message(reply.kind, reply.header, {**reply.arrays, field: c.reshape(sent.shape)})
    return alter


def _set(value):
    def change(c):
        c[0, 0, 0, 0] = value
    return change


def _one_candidate_more(c):
    c[0, 1, 0, 0] += 1


def _one_row_more(c):  # under every candidate: they agree, the node does not (a left branch is never full)
    c[0, :, 0, 0] += 1


# (reply kind, array, its name in refusals, the estimator)
EXACT = {
    "none": ("fet_counts", "counts", lambda: FederatedExtraTreesClassifier(**OPTIONS)),
    "ldp": ("fet_bit_sums", "sizes", lambda: FederatedExtraTreesClassifier(privacy="ldp", **DP)),
    "ppd-ert plain": ("ppdert_plain_counts", "counts",
                      lambda: PPDERTClassifier(secure_aggregation=False, allow_data_ranges=True, **OPTIONS)),
}
CASES = {
    "negative": (0, _set(-1), "{what} holds a count of -1, outside [0, {rows}], the rows declared in hello"),
    "above its rows": (0, _set(ROWS + 1),
                       "{what} holds a count of {above}, outside [0, {rows}], the rows declared in hello"),
    "candidates differ": (0, _one_candidate_more,
                          "{what}: the two branches of the 3 candidates of open node 0 add up to different "
                          "counts; every candidate splits the same rows"),
    "root above its rows": (0, _one_row_more,
                            "{what}: the branches of root 0 add up to {above} rows, not the {rows} declared "
                            "in hello"),
    "not the parent's branch": (1, _one_row_more,
                                "{what}: open node 0 holds other counts than the branch that made it (its "
                                "parent's chosen candidate, one level up)"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", EXACT)
def test_exact_counts_out_of_bounds_or_not_adding_up_are_refused_naming_the_party(mode, case) -> None:
    kind, field, model = EXACT[mode]
    depth, change, text = CASES[case]
    what = f"{kind}.{field}"
    expected = "party 'b': " + text.format(what=what, rows=ROWS, above=ROWS + 1)
    with pytest.raises(ProtocolError) as refused:
        _fit(model(), _altering(kind, field, depth, change))
    assert str(refused.value) == expected


def test_ldp_bit_sums_beyond_their_branch_or_not_adding_up_are_refused() -> None:
    def alter_bits(make):
        def alter(parties, message, reply):
            if reply.kind != "fet_bit_sums" or message.header.get("depth") != 0:
                return reply
            bits, sizes = reply.arrays["bit_sums"].astype(np.int64), reply.arrays["sizes"].astype(np.int64)
            make(bits, sizes)
            return Message(reply.kind, reply.header, {**reply.arrays, "bit_sums": bits})
        return alter

    def above_size(bits, sizes):
        bits[0, 0, 0, 0] = sizes[0, 0, 0] + 1

    def negative(bits, sizes):
        bits[0, 0, 0, 0] = -1

    def one_report_more(bits, sizes):  # candidate 1's left branch: one more 1 bit than its rows sent
        b = int(np.flatnonzero(bits[0, 1, 0] < sizes[0, 1, 0])[0])
        bits[0, 1, 0, b] += 1

    outside = ("party 'b': fet_bit_sums.bit_sums at open node 0 holds a bit sum outside [0, its branch's "
               "size]: a branch sums one 0/1 report per row")
    for make, text in ((above_size, outside), (negative, outside),
                       (one_report_more, "party 'b': fet_bit_sums.bit_sums: the two branches of the "
                                         "candidates of open node 0 add up to different bit sums; each "
                                         "row's one report is counted under every candidate")):
        with pytest.raises(ProtocolError) as refused:
            _fit(FederatedExtraTreesClassifier(privacy="ldp", **DP), alter_bits(make))
        assert str(refused.value) == text


@pytest.mark.parametrize("field", ["bit_sums", "sizes"])
def test_ldp_bit_sums_or_sizes_that_are_not_integers_are_refused(field) -> None:
    def as_floats(parties, message, reply):
        if reply.kind != "fet_bit_sums":
            return reply
        floats = reply.arrays[field].astype(np.float64)
        return Message(reply.kind, reply.header, {**reply.arrays, field: floats})

    with pytest.raises(ProtocolError) as refused:
        _fit(FederatedExtraTreesClassifier(privacy="ldp", **DP), as_floats)
    assert str(refused.value) == f"party 'b': fet_bit_sums.{field} must be integers, got float64"


def _regression_alter(make):
    """Alter party 'b''s first-level (count, sum q) with make(counts, bits), bits bounding its |q|."""
    def alter(parties, message, reply):
        if reply.kind != "fet_counts" or message.header["depth"] != 0:
            return reply
        hostile = parties[-1]
        bits = max(int(np.frexp(np.abs(hostile.y).max())[1]) + int(message.header["q_shift"]), 0)
        c = reply.arrays["counts"].astype(np.int64)
        make(c, bits)
        return Message(reply.kind, reply.header, {"counts": c})
    return alter


def test_regression_counts_and_target_sums_are_bounded() -> None:
    def negative(c, bits):
        c[0, 0, 0, 0] = -1

    def sum_beyond_count(c, bits):  # a branch's sum above count x 2**bits, within rows x 2**bits overall
        c[0, 0, 0, 1] = (int(c[0, 0, 0, 0]) << bits) + 1

    def huge_sum(c, bits):
        c[0, 0, 0, 1] = -(1 << 60)

    seen = {}

    def record(c, bits):
        seen["bits"] = bits

    _fit(FederatedExtraTreesRegressor(**OPTIONS), _regression_alter(record), task="regression")  # honest
    beyond = (f"party 'b': fet_counts.counts: a branch's sum of quantised targets exceeds its count times "
              f"2**{seen['bits']}, the bound on each target from the magnitude declared in hello")
    for make, text in ((negative, f"party 'b': fet_counts.counts holds a count of -1, outside [0, {ROWS}], "
                                  "the rows declared in hello"),
                       (sum_beyond_count, beyond), (huge_sum, beyond)):
        with pytest.raises(ProtocolError) as refused:
            _fit(FederatedExtraTreesRegressor(**OPTIONS), _regression_alter(make), task="regression")
        assert str(refused.value) == text


def _stating(**fields):
    """Party 'b''s hello reply with `fields` instead of what it would state."""
    def alter(parties, message, reply):
        if reply.kind == "hello_reply":
            return Message(reply.kind, {**reply.header, **fields}, reply.arrays)
        return reply
    return alter


@pytest.mark.parametrize("exponent", [257, 1000, 5000, 1.5])
def test_regression_party_must_state_an_exponent_a_label_can_have(exponent) -> None:
    """y_exponent 1000 shifted every party's targets to 0 and every prediction was 0.0 (issue #27)."""
    with pytest.raises(ProtocolError) as refused:
        _fit(FederatedExtraTreesRegressor(**OPTIONS), _stating(y_exponent=exponent), task="regression")
    assert str(refused.value) == (f"party 'b' reported no usable target magnitude ({exponent!r}); a "
                                  "regression party states y_exponent, an integer in [-1074, 256] with "
                                  "|y| < 2**y_exponent, in its hello reply")


def _exponent(frame) -> int:
    """What an honest party states: the exponent of its largest |y|."""
    return int(np.frexp(np.abs(frame["target"].to_numpy()).max())[1])


def test_regression_party_may_not_state_an_exponent_far_above_the_others() -> None:
    """One party's magnitude sets every party's fixed-point scale: at most 12 powers of two above others'."""
    others = _exponent(_frames("regression")["a"])
    with pytest.raises(ProtocolError) as refused:
        _fit(FederatedExtraTreesRegressor(**OPTIONS), _stating(y_exponent=others + 13), task="regression")
    assert str(refused.value) == (f"party 'b' stated y_exponent {others + 13} (|y| < 2**{others + 13}) in "
                                  f"hello, more than 12 above every other party's (at most {others}); its "
                                  "targets would set the fixed-point scale of all")
    model = FederatedExtraTreesRegressor(**OPTIONS)  # 12 above: a magnitude an honest party may have
    _fit(model, _stating(y_exponent=others + 12), task="regression")
    frames = _frames("regression")
    assert np.all(model.predict(frames["a"].drop(columns="target")) != 0.0)


def _plan_of(epsilon: float, **terms):
    """The GDP plan of OPTIONS (classification, k = 3) under (epsilon, 1e-6), with `terms` changed."""
    base = gdp_terms(OPTIONS["n_estimators"], OPTIONS["max_depth"], False, K, "classification", N_FEATURES)
    return gaussian_plan(epsilon, 1e-6, {**base, **terms})


def test_gdp_party_must_state_the_agreed_sigma() -> None:
    """A party stating a tiny noise scale set its own bound: +1e9 passed, one class won (issue #27)."""
    sigma = _plan_of(0.5).sigma

    def huge(parties, message, reply):
        if reply.kind == "fet_noisy_counts":
            return Message(reply.kind, reply.header, {"counts": reply.arrays["counts"] + 1e9})
        return _stating(sigma=1e-12)(parties, message, reply)

    for alter, stated in ((huge, 1e-12), (_stating(sigma=2 * sigma), 2 * sigma)):
        with pytest.raises(ProtocolError) as refused:
            _fit(FederatedExtraTreesClassifier(privacy="gdp", epsilon=0.5, **DP), alter)
        assert str(refused.value) == (f"party 'b' stated noise sigma {stated!r} in hello, but the agreed "
                                      "budget (epsilon 0.5, delta 1e-06) over 8 releases of L2 sensitivity "
                                      f"1.73205 plans sigma {sigma!r}")


def test_a_gdp_master_needs_the_agreed_budget_and_a_bounded_depth() -> None:
    frames = _frames()
    schema = build_schema(frames, "target", "classification")
    transport = InProcessTransport({name: (lambda message: message) for name in frames})
    with pytest.raises(ParameterError) as refused:
        FederatedExtraTreesMaster(transport, ExtraTreesParams(n_estimators=2, max_depth=3), schema,
                                  privacy="gdp")
    assert str(refused.value) == ("privacy 'gdp': the master needs the agreed budget (epsilon=..., the "
                                  "privacy setting's)")
    for make in (lambda: FederatedExtraTreesMaster(transport, ExtraTreesParams(n_estimators=2), schema,
                                                   privacy="gdp", epsilon=1.0),
                 lambda: FederatedExtraTreesClassifier(2, privacy={"mode": "gdp", "plan": "splits"})
                 .fit(frames, "target")):
        with pytest.raises(ParameterError) as refused:
            make()
        assert str(refused.value) == ("privacy 'gdp' needs a bounded depth: set params.max_depth (the "
                                      "model's budget is spread over trees x levels)")


def _master_planning(model, **terms):
    """`model` whose master announces the plan of `terms` (and expects its sigma), but grows OPTIONS."""
    original = model._make_master

    def make(transport, schema):
        master = original(transport, schema)
        master.plan_terms = {**master.plan_terms, **terms}
        master.plan = gaussian_plan(master.plan.epsilon, master.plan.delta, master.plan_terms)
        return master
    model._make_master = make
    return model


def test_a_gdp_party_refuses_a_master_that_asks_past_its_plan() -> None:
    """A master announcing one tree, then growing two: level 1 would take a row to 6 releases of 5.

    The plan: 3 levels, the marginal histograms and the noisy row count (charged as one release each).
    """
    model = _master_planning(FederatedExtraTreesClassifier(privacy="gdp", epsilon=1.0, **DP),
                             n_estimators=1)
    with pytest.raises(ProtocolError) as refused:
        model.fit(_frames(), "target")
    assert str(refused.value) == ("party 'a': the privacy budget (epsilon 1, delta 1e-06) is spent: a "
                                  "row would take part in 6 releases, its plan has 5; nothing more is "
                                  "released")


def test_a_gdp_party_refuses_more_candidates_than_its_plan() -> None:
    model = _master_planning(FederatedExtraTreesClassifier(privacy="gdp", epsilon=1.0, **DP), k=2)
    with pytest.raises(ProtocolError) as refused:
        model.fit(_frames(), "target")
    assert str(refused.value) == ("party 'a': fet_stats with 3 candidates per node, but the GDP plan is "
                                  "for k = 2: more raise each release's sensitivity")


def test_a_gdp_party_refuses_a_sum_noise_below_its_targets_bound() -> None:
    """A master sending a smaller q_bound_bits would scale the sums' noise below one row's reach."""
    model = FederatedExtraTreesRegressor(privacy="gdp", epsilon=1.0, **DP)
    original = model._make_master
    sent = {}

    def make(transport, schema):
        master = original(transport, schema)
        honest_setup = master.setup

        def setup():
            honest_setup()
            master.q_bits = sent["bits"] = master.q_bits - 20
        master.setup = setup
        return master
    model._make_master = make
    with pytest.raises(ProtocolError) as refused:
        model.fit(_frames("regression"), "target")
    assert str(refused.value) == (f"party 'a': q_bound_bits {sent['bits']} is below its quantised targets' "
                                  "bound: the sums' noise would not cover one row")


@pytest.mark.parametrize("mode", ["gdp", "ldp"])
def test_a_dp_party_that_sends_ranges_is_refused(mode) -> None:
    """In a DP mode thresholds come from the declared domains: a reply carrying a min or max is refused."""
    def with_ranges(parties, message, reply):
        if reply.kind != "fet_ranges_reply":
            return reply
        shape = message.arrays["features"].shape
        return Message(reply.kind, reply.header, {"min": np.zeros(shape), "max": np.ones(shape)})

    with pytest.raises(ProtocolError) as refused:
        _fit(FederatedExtraTreesClassifier(privacy=mode, **DP), with_ranges)
    assert str(refused.value) == (f"party 'b' answered 'fet_ranges_reply' with arrays ['max', 'min']; in "
                                  f"privacy {mode!r} a party sends no ranges: expected an empty "
                                  "'fet_ranges_reply'")


@pytest.mark.parametrize("mode", ["gdp", "ldp"])
def test_a_dp_master_needs_the_declared_domains(mode) -> None:
    frames = _frames()
    schema = build_schema(frames, "target", "classification")
    transport = InProcessTransport({name: (lambda message: message) for name in frames})
    with pytest.raises(ParameterError) as refused:
        FederatedExtraTreesMaster(transport, ExtraTreesParams(n_estimators=2, max_depth=3), schema,
                                  privacy=mode, epsilon=1.0 if mode == "gdp" else None)
    assert str(refused.value) == (f"privacy {mode!r}: the master draws thresholds in the declared feature "
                                  "domains (low=..., high=..., from the data contracts), never from a "
                                  "party's extremes")


@pytest.mark.parametrize("rows", [-5, 1.5, "200", True])
def test_hello_must_declare_a_row_count(rows) -> None:
    def alter(parties, message, reply):
        if reply.kind == "hello_reply":
            return Message(reply.kind, {**reply.header, "n_rows": rows}, reply.arrays)
        return reply

    with pytest.raises(ProtocolError) as refused:
        _fit(FederatedExtraTreesClassifier(**OPTIONS), alter)
    assert str(refused.value) == (f"party 'b' declared {rows!r} rows in hello; a row count is an integer "
                                  ">= 0")


def test_gdp_counts_beyond_the_largest_noise_are_refused() -> None:
    """A count is bounded by the party's noisy row count in hello plus that count's largest noise."""
    plan = _plan_of(1.0)
    reach = GAUSSIAN_NOISE_BOUND * plan.sigma
    stated: dict[str, int] = {}

    def noisy(value):
        def alter(parties, message, reply):
            if reply.kind == "hello_reply":
                stated["rows"] = reply.header["n_rows"]
            if reply.kind != "fet_noisy_counts":
                return reply
            counts = reply.arrays["counts"].copy()
            counts[0, 0, 0, 0] = value(stated["rows"] + count_reach(plan))
            return Message(reply.kind, reply.header, {"counts": counts})
        return alter

    gdp = {"privacy": "gdp", "epsilon": 1.0, **DP}
    for value in (lambda rows: 1e9, lambda rows: -reach - 0.01, lambda rows: rows + reach + 0.01):
        with pytest.raises(ProtocolError) as refused:
            _fit(FederatedExtraTreesClassifier(**gdp), noisy(value))
        rows = stated["rows"] + count_reach(plan)
        assert stated["rows"] != ROWS  # the count in hello is noisy
        assert str(refused.value) == (f"party 'b': fet_noisy_counts.counts holds a count of "
                                      f"{value(rows):.6g}, further outside [0, {rows}] (the most rows its "
                                      "noisy count in hello allows) than the largest Gaussian noise of the "
                                      f"agreed scale can reach ({reach:.6g})")
    # right at the bounds are counts an honest party can send
    _fit(FederatedExtraTreesClassifier(**gdp), noisy(lambda rows: -reach))
    _fit(FederatedExtraTreesClassifier(**gdp), noisy(lambda rows: rows + reach))
    with pytest.raises(ProtocolError, match=r"^party 'b': fet_noisy_counts.counts must be finite numbers$"):
        _fit(FederatedExtraTreesClassifier(**gdp), noisy(lambda rows: np.inf))


def _secagg_fit(change: Callable[[np.ndarray, int, np.ndarray], None]) -> None:
    """PPD-ERT with secure aggregation; party 'b' alters its counts before masking them.

    change(its counts, depth, the other party's counts), all (nodes, k, 2, classes) int64.
    """
    model = PPDERTClassifier(allow_data_ranges=True, **OPTIONS)
    original = model._make_parties

    def make(frames, schema):
        parties = original(frames, schema)
        other, hostile = parties
        honest_counts, honest_handle, depth = hostile.rows.class_counts, hostile.handle, {}

        def counts(dtype=None):
            c = honest_counts().astype(np.int64)
            change(c, depth["now"], other.rows.class_counts().astype(np.int64))
            return c

        def handle(message):
            depth["now"] = message.header.get("depth")
            return honest_handle(message)

        hostile.rows.class_counts, hostile.handle = counts, handle
        return parties

    model._make_parties = make
    model.fit(_frames(), "target")


def test_secure_aggregation_sums_are_bounded_and_add_up_but_name_no_party() -> None:
    def above_all_rows(c, depth, other):  # the sum of entry 0 becomes one more than every row
        c[0, 0, 0, 0] = TOTAL + 1 - other[0, 0, 0, 0]

    def below_zero(c, depth, other):
        c[0, 0, 0, 0] = -1 - other[0, 0, 0, 0]

    def at(level, alteration):
        def change(c, depth, other):
            if depth == level:
                alteration(c)
        return change

    what = f"{SUM_OF_PARTIES}: ppdert_masked_counts"
    for change, text in (
            (above_all_rows, f"{what} holds a count of {TOTAL + 1}, outside [0, {TOTAL}], the rows declared "
                             "in hello"),
            (below_zero, "the masked counts sum to negative values in the 16-bit ring: a party counted more "
                         "rows than it reported, or masked in another ring"),
            (at(0, _one_candidate_more), f"{what}: the two branches of the 3 candidates of open node 0 add "
                                         "up to different counts; every candidate splits the same rows"),
            (at(0, _one_row_more), f"{what}: the branches of root 0 add up to {TOTAL + 1} rows, not the "
                                   f"{TOTAL} declared in hello"),
            (at(1, _one_row_more), f"{what}: open node 0 holds other counts than the branch that made it "
                                   "(its parent's chosen candidate, one level up)")):
        with pytest.raises(ProtocolError) as refused:
            _secagg_fit(change)
        assert str(refused.value) == text


CRITERIA = {"classification": "gini", "regression": "squared_error"}


def _federation(tmp_path, task: str, privacy: dict | None, alter: Callable[[Message], Message]):
    """A HorizontalSession over three in-process institution agents; 'north' passes replies through alter."""
    from fedcore.agents.data import InstitutionData
    from fedcore.contracts.model import infer_contract
    from fedcore.horizontal.agent import HorizontalInstitutionAgent
    from fedcore.horizontal.session import HorizontalSession
    from tests.keys import master_public_key

    table = horizontal_table(seed=8, task=task, n_rows=300)
    table.insert(0, "row_id", [f"R{i:04d}" for i in range(len(table))])
    contract = infer_contract(table, "hostile", id_column="row_id", label="target")
    agents = {}
    for name, part in zip(("north", "south", "east"), split_rows(table, 3), strict=True):
        data = InstitutionData(name=name, frame=part, id_column="row_id", label="target",
                               registry=tmp_path / "registry" / name, predictions_dir=tmp_path / name,
                               contract=contract, privacy=privacy, master_key=master_public_key(tmp_path))
        agents[name] = HorizontalInstitutionAgent(data)
    honest = agents["north"].handle
    agents["north"].handle = lambda message: alter(honest(message))
    transport = InProcessTransport({n: a.handle for n, a in agents.items()})
    transport.exchange({n: Message("validation_report") for n in agents})
    session = HorizontalSession(transport, ExtraTreesParams(n_estimators=2, max_depth=3, task=task,
                                                                 criterion=CRITERIA[task]),
                                privacy=privacy)
    session.agree_schema()
    return session, contract


def _hello(**fields) -> Callable[[Message], Message]:
    def alter(reply: Message) -> Message:
        if reply.kind == "hello_reply":
            return Message(reply.kind, {**reply.header, **fields}, reply.arrays)
        return reply
    return alter


def test_a_federation_bounds_noisy_counts_by_the_configured_budget(tmp_path) -> None:
    """The session gives its master the configured budget; a hello stating another sigma is refused."""
    privacy = {"mode": "gdp", "epsilon": 0.5, "delta": 1e-7}
    session, _ = _federation(tmp_path, "classification", privacy, _hello(sigma=1e-12))
    with pytest.raises(ProtocolError) as refused:
        session.train()
    plan = session.master.plan
    assert (plan.epsilon, plan.delta) == (0.5, 1e-7)
    assert str(refused.value) == (f"party 'north' stated noise sigma 1e-12 in hello, but the agreed budget "
                                  f"(epsilon 0.5, delta 1e-07) over 8 releases of L2 sensitivity "
                                  f"{plan.sensitivity:g} plans sigma {plan.sigma!r}")
    session, _ = _federation(tmp_path / "honest", "classification", privacy, lambda reply: reply)
    session.train()
    report = session.privacy_report()
    assert (report["epsilon_budget"], report["delta"], report["sigma"]) == (0.5, 1e-7, plan.sigma)
    assert "epsilon_per_query" not in report


def test_a_federation_bounds_each_target_magnitude_by_the_contract(tmp_path) -> None:
    """The contracts declare the label in [-6, 6]: every |y| < 2**3, so y_exponent 4 is no honest party's."""
    session, contract = _federation(tmp_path, "regression", None, _hello(y_exponent=4))
    assert (contract.label.min, contract.label.max) == (-6.0, 6.0)
    with pytest.raises(ProtocolError) as refused:
        session.train()
    assert str(refused.value) == ("party 'north' stated y_exponent 4 (|y| < 2**4) in hello, but its data "
                                  "contract's label range bounds |y| below 2**3")
    session, _ = _federation(tmp_path / "honest", "regression", None, _hello(y_exponent=3))
    session.train()
    assert session.master.declared_y_exponent == {"north": 3, "south": 3, "east": 3}
