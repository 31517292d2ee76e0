"""The in-process transport: rounds and bytes per kind, transcripts, a round's parties side by side."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from fedcore.errors import ProtocolError
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport


def _echo(name: str):
    def handle(message: Message) -> Message:
        return Message("echo", {"who": name}, {"x": message.arrays.get("x", np.zeros(0)) * 2})
    return handle


def test_one_exchange_is_one_round_and_bytes_are_counted() -> None:
    transport = InProcessTransport({"a": _echo("a"), "b": _echo("b")}, record_payloads=True)
    request = Message("ping", {}, {"x": np.arange(100, dtype=np.float64)})
    replies = transport.exchange({"a": request, "b": request})
    assert transport.stats.rounds == 1
    assert replies["b"].header == {"who": "b"}
    np.testing.assert_array_equal(replies["a"].arrays["x"], np.arange(100) * 2.0)
    size = len(request.to_bytes())
    assert transport.stats.by_kind["ping"] == {"count": 2, "bytes": 2 * size}
    assert transport.stats.by_kind["echo"]["count"] == 2
    assert transport.stats.bytes == sum(e.size for e in transport.transcript)
    senders = [(e.sender, e.receiver, e.kind) for e in transport.transcript]
    assert senders == [("master", "a", "ping"), ("master", "b", "ping"), ("a", "master", "echo"),
                       ("b", "master", "echo")]
    assert Message.from_bytes(transport.transcript[0].payload).kind == "ping"
    assert transport.transcript[0].schema == "x:float64[100]"


def test_unknown_party_is_refused() -> None:
    transport = InProcessTransport({"a": _echo("a")})
    with pytest.raises(ProtocolError, match="no party named 'zz'"):
        transport.exchange({"zz": Message("ping")})


def test_transcript_is_off_by_default() -> None:
    transport = InProcessTransport({"a": _echo("a")})
    transport.exchange({"a": Message("ping")})
    assert transport.transcript == [] and transport.stats.messages == 2


@pytest.fixture
def threadsafe_kernels(monkeypatch) -> None:
    """Side by side whatever numba's layer here: these handlers launch no kernel (`kernels_threadsafe`)."""
    monkeypatch.setattr("fedcore.transport.inprocess.kernels_threadsafe", lambda: True)


def _meeting(name: str, barrier: threading.Barrier, answered: list[str]):
    """A handler that answers only once every party of the round is handling its request at once."""
    def handle(message: Message) -> Message:
        barrier.wait()
        answered.append(name)
        return Message("echo", {"who": name})
    return handle


def test_a_rounds_parties_answer_side_by_side(threadsafe_kernels) -> None:
    barrier, answered = threading.Barrier(3, timeout=10), []
    transport = InProcessTransport({n: _meeting(n, barrier, answered) for n in "abc"}, record_transcript=True,
                                   concurrent=True)
    replies = transport.exchange({n: Message("ping") for n in "cab"})
    assert sorted(answered) == ["a", "b", "c"]  # all three were inside their handlers together
    assert list(replies) == ["c", "a", "b"] and [r.header["who"] for r in replies.values()] == ["c", "a", "b"]
    assert [(e.sender, e.receiver) for e in transport.transcript] == [
        ("master", "c"), ("master", "a"), ("master", "b"), ("c", "master"), ("a", "master"), ("b", "master")]


def test_by_default_parties_answer_in_request_order() -> None:
    barrier, answered = threading.Barrier(2, timeout=0.2), []
    transport = InProcessTransport({n: _meeting(n, barrier, answered) for n in "ab"})
    with pytest.raises(threading.BrokenBarrierError):  # alone in its handler, the first party waits in vain
        transport.exchange({"b": Message("ping"), "a": Message("ping")})
    assert answered == []


def _refusing(name: str, answered: list[str]):
    def handle(message: Message) -> Message:
        answered.append(name)
        if name in ("b", "c"):
            raise ProtocolError(f"party {name!r} refuses the request")
        return Message("echo", {"who": name})
    return handle


def test_the_first_refusal_in_request_order_is_raised(threadsafe_kernels) -> None:
    answered: list[str] = []
    transport = InProcessTransport({n: _refusing(n, answered) for n in "abc"}, concurrent=True)
    with pytest.raises(ProtocolError, match="^party 'c' refuses the request$"):
        transport.exchange({n: Message("ping") for n in "acb"})
    assert sorted(answered) == ["a", "b", "c"]


def test_a_round_naming_an_unknown_party_reaches_no_party() -> None:
    answered: list[str] = []
    transport = InProcessTransport({n: _refusing(n, answered) for n in "a"})
    with pytest.raises(ProtocolError, match="no party named 'zz'"):
        transport.exchange({"a": Message("ping"), "zz": Message("ping")})
    assert answered == []


class _Named:
    """A handler that pickles (a fitted estimator's transport pickles with its parties' handlers)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, message: Message) -> Message:
        return Message("echo", {"who": self.name})


def test_the_transport_pickles_after_a_concurrent_round(threadsafe_kernels) -> None:
    transport = InProcessTransport({"a": _Named("a"), "b": _Named("b")}, concurrent=True)
    transport.exchange({"a": Message("ping"), "b": Message("ping")})
    again = pickle.loads(pickle.dumps(transport))
    assert again.stats.rounds == 1
    assert again.exchange({"a": Message("ping"), "b": Message("ping")})["b"].header == {"who": "b"}


def test_without_a_threadsafe_kernel_layer_the_parties_answer_in_turn(monkeypatch) -> None:
    monkeypatch.setattr("fedcore.transport.inprocess.kernels_threadsafe", lambda: False)
    threads: list[tuple[str, str]] = []

    def handler(name: str):
        def handle(message: Message) -> Message:
            threads.append((name, threading.current_thread().name))
            return Message("echo", {"who": name})
        return handle

    transport = InProcessTransport({n: handler(n) for n in "abc"}, concurrent=True)
    replies = transport.exchange({n: Message("ping") for n in "bca"})
    assert [r.header["who"] for r in replies.values()] == ["b", "c", "a"]
    assert threads == [(n, threading.current_thread().name) for n in "bca"]


_WORKQUEUE_ROUND = """
import numpy as np
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport, _parallel_probe, kernels_threadsafe

def party(name):
    def handle(message):
        values = np.ones(1_000_000)
        for _ in range(100):  # two threads launching these together would abort under workqueue
            _parallel_probe(values)
        return Message("echo", {"who": name})
    return handle

transport = InProcessTransport({n: party(n) for n in "abc"}, concurrent=True)
replies = transport.exchange({n: Message("ping") for n in "abc"})
print(kernels_threadsafe(), [r.header["who"] for r in replies.values()])
"""


def test_numbas_workqueue_layer_gets_one_party_after_another() -> None:
    """Numba's fallback layer aborts a process whose threads launch parallel kernels together."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    done = subprocess.run([sys.executable, "-c", _WORKQUEUE_ROUND], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False ['a', 'b', 'c']"


def _round_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("fedforest-inprocess")}


def test_close_ends_the_round_threads_and_a_later_round_starts_new_ones(threadsafe_kernels) -> None:
    before = _round_threads()
    transport = InProcessTransport({n: _Named(n) for n in "abc"}, concurrent=True)
    transport.exchange({n: Message("ping") for n in "abc"})
    started = _round_threads() - before
    assert started  # the round's other parties answered in the transport's threads
    transport.close()
    assert not any(t.is_alive() for t in started)
    assert transport.exchange({n: Message("ping") for n in "abc"})["c"].header == {"who": "c"}
    again = _round_threads() - before
    assert again and not again & started
    transport.close()
    transport.close()  # closing twice is closing once
    assert not any(t.is_alive() for t in again)
