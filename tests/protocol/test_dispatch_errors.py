"""The dispatcher tells a malformed message (the peer's fault) from a bug in our own handler (issue #34).

A field read through `Header`/`Arrays`'s typed readers that is missing or of the wrong type is refused with
one line naming the field and never its value; any other exception (a KeyError or TypeError included) is
our bug: a traceback in this party's log, a generic InternalError for the peer. Every handler family (the
vertical, FET and PPD-ERT parties, an agent's own session messages) reads through the readers.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedcore.errors import InternalError, MalformedMessage, ProtocolError
from fedcore.protocol.dispatch import Protocol, Step
from fedcore.protocol.messages import Message

PROTOCOL = Protocol("test", "idle", {"idle": "waiting", "done": "answered"},
                    [Step("idle", "grow", "done", "grown"), Step("idle", "boom", "done", "grown")])
SECRET = "label-value-4711"  # what a bug's text might quote: it must reach neither the log nor the peer


class Party:
    """A party whose `grow` reads its fields through the typed readers and whose `boom` has a bug."""

    name = "p"

    def __init__(self) -> None:
        self.machine = PROTOCOL.start(logging.getLogger("tests.dispatch"))

    def handle(self, message: Message) -> Message:
        """What an agent server calls: the party's protocol machine."""
        return self.machine.handle(self, message)

    def _on_grow(self, message: Message) -> Message:
        depth = message.header.int("depth", 0, 10)
        rows = message.arrays.typed("rows", "i")
        return Message("grown", {"depth": depth, "rows": len(rows)})

    def _on_boom(self, message: Message) -> Message:
        raise RuntimeError(f"our own bug, quoting {SECRET}")


def _received(header: dict, arrays: dict) -> Message:
    return Message.from_bytes(Message("grow", header, arrays).to_bytes())


@pytest.mark.parametrize(("header", "arrays", "line"), [
    ({}, {"rows": np.arange(3)}, "header field 'depth' is missing"),
    ({"depth": "4711"}, {"rows": np.arange(3)}, "header field 'depth' must be an integer in [0, 10]"),
    ({"depth": 4711}, {"rows": np.arange(3)}, "header field 'depth' must be an integer in [0, 10]"),
    ({"depth": True}, {"rows": np.arange(3)}, "header field 'depth' must be an integer in [0, 10]"),
    ({"depth": 3}, {}, "array 'rows' is missing"),
    ({"depth": 3}, {"rows": np.full(2, 4711.5)},
     "array 'rows' must be of dtype kind 'i', 1-dimensional: found float64 of shape [2]"),
])
def test_a_malformed_field_is_refused_naming_the_field_not_its_value(header, arrays, line, caplog) -> None:
    party = Party()
    with pytest.raises(MalformedMessage) as refused:
        party.machine.handle(party, _received(header, arrays))
    assert str(refused.value) == f"party 'p' refuses a malformed 'grow' message: {line}"
    assert isinstance(refused.value, ProtocolError) and "4711" not in line.replace("[0, 10]", "")
    assert [r.getMessage() for r in caplog.records] == [f"refused a 'grow' message: {refused.value}"]
    assert party.machine.state == "idle"
    reply = party.machine.handle(party, _received({"depth": 3}, {"rows": np.arange(3)}))
    assert (reply.kind, reply.header) == ("grown", {"depth": 3, "rows": 3})


def test_a_bug_in_a_handler_is_an_internal_error_with_a_traceback_in_our_log(caplog) -> None:
    party = Party()
    with caplog.at_level(logging.ERROR, logger="tests.dispatch"):
        with pytest.raises(InternalError) as failed:
            party.machine.handle(party, Message.from_bytes(Message("boom").to_bytes()))
    assert not isinstance(failed.value, ProtocolError)  # not the peer's fault
    assert str(failed.value) == ("party 'p' could not answer 'boom': an internal error (its traceback is in "
                                 "that party's log)")
    assert isinstance(failed.value.__cause__, RuntimeError)  # chained, for our side's own traceback
    (record,) = caplog.records
    text = record.getMessage()
    assert record.levelno == logging.ERROR
    assert text.startswith("party 'p' failed on 'boom': a bug in its own code, not the peer's fault\n"
                           "Traceback (most recent call last):\n")
    assert "test_dispatch_errors.py" in text and "in _on_boom" in text  # where the bug is
    assert text.endswith("RuntimeError (its text is withheld: it may quote the institution's data)")
    assert SECRET not in text  # the source line quotes the name SECRET, never its value
    assert party.machine.state == "idle"


def test_header_readers_take_only_their_own_types() -> None:
    header = Message.from_bytes(Message("m", {"n": 3, "x": 2.5, "big": 10**400, "s": "a", "f": False,
                                              "nan": float("nan")}).to_bytes()).header
    read = (header.int("n", 0), header.number("x"), header.number("n"), header.text("s"), header.flag("f"))
    assert read == (3, 2.5, 3.0, "a", False)
    assert header.int("big", 0) == 10**400
    for read, line in [(lambda: header.int("x"), "header field 'x' must be an integer"),
                       (lambda: header.number("big"), "header field 'big' must be a finite number"),
                       (lambda: header.number("nan"), "header field 'nan' must be a finite number"),
                       (lambda: header.number("x", 3), "header field 'x' must be a finite number >= 3"),
                       (lambda: header.text("n"), "header field 'n' must be a string"),
                       (lambda: header.flag("n"), "header field 'n' must be true or false")]:
        with pytest.raises(MalformedMessage) as error:
            read()
        assert str(error.value) == line


def test_an_agents_session_handler_tells_a_malformed_field_from_its_own_bug(tmp_path, caplog) -> None:
    """An institution agent's session messages (not dispatched to its party) are classified the same way.

    A field read unchecked (a handler not reading through the typed readers) is now our own bug too.
    """
    from fedcore.vertical.agent import VerticalInstitutionAgent
    from tests.vertical.test_agent_fuzz import _agents

    agent: VerticalInstitutionAgent = _agents(tmp_path)["p1"]
    agent.handle(Message("validation_report"))
    unchecked = lambda message: Message("x", {"n": int(message.header["version"])})  # noqa: E731
    agent._on_store_model = unchecked  # type: ignore[method-assign]
    with pytest.raises(InternalError) as failed:
        agent.handle(Message.from_bytes(Message("store_model", {"version": [4711]}).to_bytes()))
    assert str(failed.value) == ("party 'p1' could not answer 'store_model': an internal error (its "
                                 "traceback is in that party's log)")
    agent._on_store_model = lambda message: Message("x", {"n": message.header.int("version")})  # noqa: E731
    with pytest.raises(MalformedMessage) as refused:
        agent.handle(Message.from_bytes(Message("store_model", {"version": [4711]}).to_bytes()))
    assert str(refused.value) == ("institution 'p1' refuses a malformed 'store_model' message: header field "
                                  "'version' must be an integer")

    def bug(message: Message) -> Message:
        raise RuntimeError(SECRET)

    agent._on_evaluate = bug  # type: ignore[method-assign]
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="fedcore.agents.base"):
        with pytest.raises(InternalError, match=r"^party 'p1' could not answer 'evaluate': an internal "):
            agent.handle(Message("evaluate"))
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Traceback (most recent call last)" in record.getMessage() and "in bug" in record.getMessage()
    assert SECRET not in record.getMessage()


# -- every handler family reads its fields through the typed readers ----------------------------------------
@pytest.mark.parametrize(("federation", "target", "kind", "message", "line"), [
    ("vertical-plain", "passive", "finalize",
     Message("finalize", {"n_trees": 1},
             {name: np.zeros(3) + 0.5 for name in ("tree", "node", "left", "right")}),
     "array 'tree' must be of dtype kind 'iu', 1-dimensional: found float64 of shape [3]"),
    ("vertical-plain", "holder", "finalize",
     Message("finalize", {"n_trees": "4711"}, {name: np.zeros(3, np.int32)
                                               for name in ("tree", "node", "left", "right")}),
     "header field 'n_trees' must be an integer >= 0"),
    ("fet-none", "a", "fet_ranges", Message("fet_ranges", {"depth": 0, "new_batch": True, "n_trees": 2},
                                            {"features": np.zeros((2, 3)) + 0.5}),
     "array 'features' must be of dtype kind 'iu', 2-dimensional: found float64 of shape [2, 3]"),
    ("ppdert-plain", "b", "ppdert_level",
     Message("ppdert_level", {"depth": 0, "new_batch": True, "n_trees": 2}, {"tree": np.array([0.5, 1.5])}),
     "array 'tree' must be of dtype kind 'iu', 1-dimensional: found float64 of shape [2]"),
    ("ppdert-secagg", "a", "model", Message("model", {"algorithm": "ppd-ert", "n_trees": 1, "task": 4711},
                                            {"tree": np.zeros(1, np.int32)}),
     "header field 'task' must be a string"),
])
def test_each_party_family_refuses_a_malformed_field_in_one_line(federation, target, kind, message, line,
                                                                 caplog) -> None:
    """The vertical, FET and PPD-ERT parties: a malformed field is refused naming it, never as our bug."""
    from tests.protocol.test_party_refusals import _until

    party = _until(federation, target, kind)[target]
    state = party.machine.state
    with pytest.raises(MalformedMessage) as refused:
        party.handle(Message.from_bytes(message.to_bytes()))
    assert str(refused.value) == f"party {target!r} refuses a malformed {kind!r} message: {line}"
    assert party.machine.state == state
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)  # not logged as our own bug


@pytest.mark.parametrize(("kind", "header", "line"), [
    ("resume_status", {"run": 4711, "context": "c"}, "header field 'run' must be a string"),
    ("load_model", {"model": "m", "version": 1, "table_sha256": "0" * 64},
     "header field 'version' must be a string"),
    ("withdraw_model", {"model": ["m"], "version": "v1"}, "header field 'model' must be a string"),
])
def test_an_agents_session_message_with_a_malformed_field_is_refused_in_one_line(tmp_path, kind, header,
                                                                                 line) -> None:
    """An institution agent's own session messages read their fields through the same readers."""
    from tests.vertical.test_agent_fuzz import _agents

    agent = _agents(tmp_path)["p1"]
    agent.handle(Message("validation_report"))
    with pytest.raises(MalformedMessage) as refused:
        agent.handle(Message.from_bytes(Message(kind, header).to_bytes()))
    assert str(refused.value) == f"institution 'p1' refuses a malformed {kind!r} message: {line}"
