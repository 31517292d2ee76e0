"""Every party type answers only its own protocol, in order (`fedcore.protocol.dispatch`).

Direct tests: a PPD-ERT party refuses FET's messages; a level before the session's first message is refused
by every party type; refusals are logged and leave the party where it was; a party takes a new session
after the model.

The fuzz, per party type (vertical plain and Paillier, label holder and passive; FET in each privacy mode;
PPD-ERT with and without secure aggregation): a small real training of every federation runs once, keeping
a copy of each fuzzed party before every message it gets. An example takes the party as it was at a drawn
point of its run and sends it a drawn sequence of messages: recorded messages of every protocol (kinds
swapped, header values and arrays perturbed, dropped or taken from other messages) and some of its own
run's next ones. The party may refuse (ProtocolError, KeyAuthenticationError included) but never fail
otherwise, and never answers with a kind outside its own protocol.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.data.split import split_vertical
from fedcore.errors import MalformedMessage, ProtocolError
from fedcore.horizontal.fet.master import FederatedExtraTreesMaster
from fedcore.horizontal.fet.party import FET_PROTOCOL, HorizontalParty
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.ppdert.master import PPDERTMaster
from fedcore.horizontal.ppdert.party import PPDERT_PROTOCOL, PPDERTParty
from fedcore.horizontal.validation import build_schema, resolve_feature_ranges
from fedcore.privacy.keyauth import ephemeral_identities
from fedcore.privacy.paillier import generate_keypair
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.params import ForestParams
from fedcore.vertical.master import VerticalMaster
from fedcore.vertical.party import FEDERATED_FOREST, VerticalParty
from tests.conftest import mixed_table
from tests.horizontal.common import horizontal_table, split_rows

ALL_KINDS = sorted(FEDERATED_FOREST.kinds | FET_PROTOCOL.kinds | PPDERT_PROTOCOL.kinds
                   | {"validation_report", "bogus", ""})
"""Every party protocol's message kinds, one session kind of the agents and two made up."""
FEATURE_KEY = b"refusal-tests-feature-key-012345"
PAILLIER_KEY = generate_keypair(1024, insecure_for_tests=True)
"""The label holders' key (also in plain mode: an injected Paillier setup then generates no key)."""


class Stop(Exception):
    """Ends a run at the drawn message."""


# -- small federations of every party type ------------------------------------------------------------------
def _vertical(privacy: str):
    frames = split_vertical(mixed_table(n_rows=80, seed=5), 2, label="target", seed=7, label_party=0)
    names = ["holder", "passive"]
    identities = ephemeral_identities(names) if privacy == "paillier" else {}
    parties = {name: VerticalParty(name, frame, "target" if "target" in frame else None,
                                   feature_key=FEATURE_KEY,
                                   label_key=PAILLIER_KEY if "target" in frame else None,
                                   identity=identities.get(name))
               for name, frame in zip(names, frames, strict=True)}
    params = ForestParams(n_estimators=2, max_depth=3, tree_batch_size=1, random_state=1, privacy=privacy)

    def run(transport: InProcessTransport) -> None:
        master = VerticalMaster(transport, params)
        master.fit()
        for name, frame in zip(names, frames, strict=True):
            parties[name].set_prediction_data(frame.drop(columns=["target"], errors="ignore").head(16))
        master.predict_values(16, "one-round")
        master.predict_values(16, "node-by-node")
    return parties, run


def _horizontal_frames():
    frames = dict(zip(["a", "b"], split_rows(horizontal_table(seed=8, n_rows=120), 2), strict=True))
    return frames, build_schema(frames, "target", "classification")


HORIZONTAL_PARAMS = ExtraTreesParams(n_estimators=2, max_depth=3, tree_batch_size=1, random_state=1)


def _fet(privacy: str):
    from fedcore.privacy.ldp import LabelLDP

    frames, schema = _horizontal_frames()
    ldp = LabelLDP() if privacy == "ldp" else None
    parties = {name: HorizontalParty(name, frame, schema, privacy=privacy, ldp=ldp, noise_seed=1)
               for name, frame in frames.items()}

    def run(transport: InProcessTransport) -> None:
        low, high, _ = resolve_feature_ranges(schema, None, frames, allow_data_ranges=True)
        FederatedExtraTreesMaster(transport, HORIZONTAL_PARAMS, schema, privacy=privacy,
                                  epsilon=1.0 if privacy == "gdp" else None, ldp=ldp, low=low,
                                  high=high).fit()  # the party's
    return parties, run


def _ppdert(secure: bool, thresholds: str):
    frames, schema = _horizontal_frames()
    low, high, _ = resolve_feature_ranges(schema, None, frames, allow_data_ranges=True)
    k = HORIZONTAL_PARAMS.n_candidate_features(schema.n_features)
    identities = ephemeral_identities(frames) if secure else {}
    parties = {name: PPDERTParty(name, frame, schema, seed=HORIZONTAL_PARAMS.random_state, low=low,
                                 high=high, k=k, secure=secure, identity=identities.get(name),
                                 thresholds=thresholds)
               for name, frame in frames.items()}

    def run(transport: InProcessTransport) -> None:
        PPDERTMaster(transport, HORIZONTAL_PARAMS, schema, low=low, high=high, secure=secure,
                     thresholds=thresholds).fit()
    return parties, run


FEDERATIONS: dict[str, Callable] = {
    "vertical-plain": lambda: _vertical("none"),
    "vertical-paillier": lambda: _vertical("paillier"),
    "fet-none": lambda: _fet("none"),
    "fet-gdp": lambda: _fet("gdp"),
    "fet-ldp": lambda: _fet("ldp"),
    "ppdert-secagg": lambda: _ppdert(True, "histogram"),
    "ppdert-plain": lambda: _ppdert(False, "domain"),
}
PARTY_TYPES = [("vertical-plain", "holder"), ("vertical-plain", "passive"), ("vertical-paillier", "holder"),
               ("vertical-paillier", "passive"), ("fet-none", "a"), ("fet-gdp", "a"), ("fet-ldp", "b"),
               ("ppdert-secagg", "a"), ("ppdert-plain", "b")]


def _send(party, message: Message) -> str:
    """The party's answer to `message` (as it would arrive over a transport): its kind, or "refused"."""
    try:
        reply = party.handle(Message.from_bytes(message.to_bytes()))
    except ProtocolError:
        return "refused"
    assert reply.kind in party.protocol.replies, (f"{party.name!r} answered {reply.kind!r} outside its "
                                                  "protocol")
    return reply.kind


def _clone(party):
    """A deep copy of a party in its current state.

    Cryptography's key and cipher objects (immutable, and not copyable) are shared with the original.
    """
    memo: dict[int, object] = {}
    seen: set[int] = set()
    stack = [party]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        module = type(obj).__module__
        if module.startswith("cryptography"):
            memo[id(obj)] = obj
        elif module.startswith(("numpy", "pandas", "logging")):
            continue
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return copy.deepcopy(party, memo)


@dataclass
class Recorded:
    pool: list[Message]
    """Every master message of a real run of every federation."""
    snapshots: dict[tuple[str, str], list]
    """Per fuzzed party: a copy of it before each message it got in its federation's run, and after it."""
    received: dict[tuple[str, str], list[Message]]
    """Per fuzzed party: the messages it got, in order."""


def _record(federation: str, recorded: Recorded) -> None:
    """Run `federation` once, keeping its master's messages and copies of its fuzzed parties."""
    parties, run = FEDERATIONS[federation]()
    targets = [name for f, name in PARTY_TYPES if f == federation]

    def handler(name: str):
        party = parties[name]

        def handle(message: Message) -> Message:
            if name in targets:
                recorded.snapshots.setdefault((federation, name), []).append(_clone(party))
                recorded.received.setdefault((federation, name), []).append(message)
            reply = party.handle(message)
            assert reply.kind in party.protocol.replies
            return reply
        return handle

    transport = InProcessTransport({name: handler(name) for name in parties}, record_payloads=True)
    run(transport)
    for name in targets:
        recorded.snapshots[federation, name].append(_clone(parties[name]))
    recorded.pool.extend(Message.from_bytes(e.payload) for e in transport.transcript if e.sender == "master")


@pytest.fixture(scope="module")
def recorded() -> Recorded:
    out = Recorded([], {}, {})
    for federation in FEDERATIONS:
        _record(federation, out)
    return out


# -- the fuzz -----------------------------------------------------------------------------------------
VALUES = st.one_of(st.integers(-3, 300), st.none(), st.booleans(), st.text("ab0-", max_size=4),
                   st.lists(st.integers(-2, 20), max_size=3))
"""Plausible header values: small integers, null, text, short integer lists."""


def _perturbed_array(data: st.DataObject, array: np.ndarray, pool: list[Message]) -> np.ndarray:
    flat = np.asarray(array).reshape(-1)
    choice = data.draw(st.sampled_from(["empty", "half", "float", "negative", "large", "other"]))
    if choice == "empty":
        return flat[:0]
    if choice == "half":
        return flat[: len(flat) // 2]
    if choice == "other":
        donor = data.draw(st.sampled_from([m for m in pool if m.arrays]))
        return donor.arrays[data.draw(st.sampled_from(sorted(donor.arrays)))]
    if flat.dtype.kind not in "iuf" or not len(flat):
        return flat
    if choice == "float":
        return flat.astype(np.float64) + 0.5
    values = flat.astype(np.int64) if flat.dtype.kind in "iu" else flat.copy()
    values[data.draw(st.integers(0, len(values) - 1))] = -1 if choice == "negative" else 10**6
    return values.reshape(np.shape(array)) if data.draw(st.booleans()) else values


def _message(data: st.DataObject, pool: list[Message]) -> Message:
    """A recorded message of any protocol.

    Perhaps under another kind, with a header value or an array perturbed or dropped.
    """
    base = data.draw(st.sampled_from(pool))
    kind = data.draw(st.sampled_from(ALL_KINDS)) if data.draw(st.integers(0, 3)) == 0 else base.kind
    header, arrays = dict(base.header), dict(base.arrays)
    if header and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(header)))
        if data.draw(st.integers(0, 4)):
            header[key] = data.draw(VALUES)
        else:
            del header[key]
    if arrays and data.draw(st.booleans()):
        name = data.draw(st.sampled_from(sorted(arrays)))
        if data.draw(st.integers(0, 4)):
            arrays[name] = _perturbed_array(data, arrays[name], pool)
        else:
            del arrays[name]
    return Message(kind, header, arrays)


@pytest.mark.parametrize(("federation", "target"), PARTY_TYPES, ids=[f"{f}-{t}" for f, t in PARTY_TYPES])
def test_random_messages_of_every_protocol_never_crash_a_party_or_leave_its_protocol(
        recorded, federation, target, caplog) -> None:
    snapshots, own = recorded.snapshots[federation, target], recorded.received[federation, target]
    tally: dict[str, int] = {}
    caplog.set_level(logging.ERROR)  # thousands of refusals: keep them out of the captured log

    examples = 40 if federation.startswith("vertical") else 80  # vertical levels run numba kernels: slower
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(st.data())
    def one(data: st.DataObject) -> None:
        at = data.draw(st.integers(0, len(snapshots) - 1), label="the party as before its message number")
        party = _clone(snapshots[at])
        for _ in range(data.draw(st.integers(1, 6), label="messages")):
            if data.draw(st.integers(0, 3)) == 0 and at < len(own):  # one of its own run's next messages
                message = own[min(at + data.draw(st.integers(0, 2)), len(own) - 1)]
            else:
                message = _message(data, recorded.pool)
            outcome = _send(party, message)
            tally[outcome] = tally.get(outcome, 0) + 1

    one()
    answered = sum(n for kind, n in tally.items() if kind != "refused")
    assert tally.get("refused", 0) > answered > 0, tally  # mostly refused, yet the handlers were reached


# -- direct tests ------------------------------------------------------------------------------------------
def _until(federation: str, target: str, kind: str, after: str | None = None):
    """The federation's parties when `target` is about to get its first `kind` message.

    With `after`: its first message following its first `after` message. The run is stopped there.
    """
    parties, run = FEDERATIONS[federation]()
    received: list[str] = []

    def handler(name: str):
        def handle(message: Message) -> Message:
            if name == target:
                if (message.kind == kind) if after is None else after in received:
                    raise Stop
                received.append(message.kind)
            return parties[name].handle(message)
        return handle

    with pytest.raises(Stop):
        run(InProcessTransport({name: handler(name) for name in parties}))
    return parties


@pytest.mark.parametrize("kind", ["fet_ranges", "fet_stats"])
def test_a_ppdert_party_refuses_fet_messages_and_logs_why(kind, caplog) -> None:
    # after hello, where a FET party would take ranges
    party = _until("ppdert-secagg", "a", "ppdert_cells")["a"]
    request = {"fet_ranges": Message("fet_ranges", {"new_batch": True, "n_trees": 2, "depth": 0},
                                     {"features": np.zeros((2, 3), np.int32)}),
               "fet_stats": Message("fet_stats", {"depth": 0, "q_shift": 0},
                                    {"thresholds": np.zeros((2, 3))})}[kind]
    expected = (f"party 'a' cannot handle message kind '{kind}': not a message of the PPD-ERT protocol "
                "(it answers hello, model, ppdert_cells, ppdert_counts, ppdert_level)")
    with caplog.at_level(logging.WARNING, logger="fedcore.horizontal.ppdert.party"):
        with pytest.raises(ProtocolError) as refused:
            party.handle(request)
    assert str(refused.value) == expected
    assert [r.getMessage() for r in caplog.records] == [f"refused a '{kind}' message: {expected}"]
    assert caplog.records[0].levelno == logging.WARNING
    assert caplog.records[0].name == "fedcore.horizontal.ppdert.party"
    assert party.machine.state == "greeted"  # unchanged: the real next level is still answered
    assert not hasattr(party, "_on_fet_ranges") and not hasattr(party, "_on_fet_stats")


LEVELS = {  # per party type: the protocol's level request, and what the refusal says the party expects first
    "vertical-plain": ("holder", "find_splits", "setup"),
    "vertical-paillier": ("passive", "find_splits", "setup"),
    "fet-none": ("a", "fet_ranges", "hello"),
    "fet-ldp": ("b", "fet_stats", "hello"),
    "ppdert-secagg": ("a", "ppdert_cells", "hello"),
    "ppdert-plain": ("b", "ppdert_level", "hello"),
}


@pytest.mark.parametrize("federation", list(LEVELS))
def test_a_level_before_the_session_starts_is_refused_and_logged(recorded, federation, caplog) -> None:
    target, kind, first = LEVELS[federation]
    parties, _ = FEDERATIONS[federation]()
    party = parties[target]
    request = next(m for m in recorded.pool if m.kind == kind)  # a real one, from a real run
    with caplog.at_level(logging.WARNING):
        with pytest.raises(ProtocolError,
                           match=rf"party '{target}' refuses '{kind}' out of protocol order: in state "
                                 rf"'idle' \(.*\) it expects .*{first}"):
            party.handle(request)
    assert any(f"refuses '{kind}' out of protocol order" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    assert party.machine.state == "idle"


def test_fet_stats_before_fet_ranges_is_refused() -> None:
    party = _until("fet-none", "a", "fet_ranges")["a"]
    with pytest.raises(ProtocolError, match=r"party 'a' refuses 'fet_stats' out of protocol order: in state "
                                            r"'greeted' \(after hello\) it expects fet_ranges or model"):
        party.handle(Message("fet_stats", {"depth": 0}, {"thresholds": np.zeros((2, 3))}))


def test_a_header_field_of_the_wrong_type_is_refused_naming_the_field(caplog) -> None:
    """A party reads its header fields through the typed readers: the peer's error, named, no value quoted."""
    party = _until("vertical-plain", "holder", "setup")["holder"]
    with pytest.raises(MalformedMessage) as refused:
        party.handle(Message("setup", {"criterion": "gini-4711", "max_bins": 32}))
    assert str(refused.value) == ("party 'holder' refuses a malformed 'setup' message: header field "
                                  "'criterion' must be an integer")
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)  # not logged as our own bug


def test_a_message_of_another_role_or_mode_is_refused() -> None:
    # the holder searched its first level
    parties = _until("vertical-plain", "holder", "", after="find_splits")
    with pytest.raises(ProtocolError,
                       match=r"party 'holder' refuses 'evaluate_encrypted': in the Federated Forest "
                             r"protocol only a party in role encrypted-holder or secure-boost-holder "
                             r"answers it, this party is plain-holder"):
        parties["holder"].handle(Message("evaluate_encrypted",
                                         {"parties": ["passive"], "min_samples_leaf": 1}))
    parties = _until("vertical-paillier", "holder", "export_labels")
    with pytest.raises(ProtocolError,
                       match=r"party 'passive' refuses 'export_labels': .* only a party in role "
                             r"boost-holder or encrypted-holder or plain-holder or secure-boost-holder "
                             r"answers it, this party is encrypted-passive"):
        parties["passive"].handle(Message("export_labels", {"max_weight": 80}))
    # a Paillier label holder scores first
    parties = _until("vertical-paillier", "holder", "", after="find_splits")
    with pytest.raises(ProtocolError,
                       match=r"refuses 'apply_splits' out of protocol order: in state 'searched' "
                             r"\(after a level's find_splits \(a batch's first level: begin_batch\)\) "
                             r"it expects evaluate_encrypted"):
        parties["holder"].handle(Message("apply_splits"))


@pytest.mark.parametrize("federation", ["fet-gdp", "ppdert-secagg", "vertical-paillier"])
def test_refused_messages_leave_a_party_where_it_was(recorded, federation) -> None:
    """Before every real message, each party is sent a stray one of another protocol and refuses it.

    The run then ends with the forest of an undisturbed run.
    """
    strays = {"vertical-paillier": "fet_stats", "fet-gdp": "ppdert_level", "ppdert-secagg": "fet_ranges"}
    stray = next(m for m in recorded.pool if m.kind == strays[federation])
    reference = _forest(federation)
    parties, run = FEDERATIONS[federation]()

    def handler(name: str):
        def handle(message: Message) -> Message:
            assert _send(parties[name], stray) == "refused"
            return parties[name].handle(message)
        return handle

    run(InProcessTransport({name: handler(name) for name in parties}))
    assert _models(parties) == reference


def _models(parties) -> dict[str, bytes]:
    """Every party's model, as bytes."""
    from fedcore.models.tables import party_table

    out = {}
    for name, party in parties.items():
        table = party.model.to_table() if hasattr(party.model, "to_table") else party_table(party.model)
        out[name] = table.to_pandas().to_csv().encode()
    return out


def _forest(federation: str) -> dict[str, bytes]:
    parties, run = FEDERATIONS[federation]()
    run(InProcessTransport({name: party.handle for name, party in parties.items()}))
    return _models(parties)


@pytest.mark.parametrize("federation", ["fet-none", "ppdert-secagg", "vertical-plain"])
def test_a_party_takes_a_new_session_after_the_model(federation) -> None:
    """The same party objects train twice; the second session's forest is the first's."""
    parties, run = FEDERATIONS[federation]()
    transport = InProcessTransport({name: party.handle for name, party in parties.items()})
    run(transport)
    first = _models(parties)
    assert {party.machine.state for party in parties.values()} == {"idle"}
    run(transport)
    assert _models(parties) == first


@pytest.mark.parametrize(("federation", "target", "skip_to"), [("vertical-paillier", "holder", "finalize"),
                                                               ("vertical-plain", "passive", "finalize"),
                                                               ("ppdert-secagg", "a", "model")])
def test_a_run_resumed_after_its_last_batch_skips_every_level(recorded, federation, target, skip_to) -> None:
    """Every batch restored from checkpoints: the session's setup is followed by the end directly."""
    own = recorded.received[federation, target]
    first_level = next(i for i, m in enumerate(own) if m.kind in ("begin_batch", "ppdert_level",
                                                                  "ppdert_cells"))
    party = _clone(recorded.snapshots[federation, target][first_level])
    assert _send(party, next(m for m in own if m.kind == skip_to)) == "ack"
    assert party.machine.state == "idle"
