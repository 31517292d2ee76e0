"""Fuzz an institution agent's message handling with messages a buggy or hostile master could send:
real protocol messages from a training run with their arrays and header values perturbed (out-of-range
and negative indices, wrong lengths and dtypes, huge counts). Every call must end, quickly, in an answer
or a Python exception (never a crash of the process or a hang), and afterwards a fresh session must
still train exactly as before."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.data.split import split_vertical
from fedcore.institution import InstitutionData
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.params import ForestParams
from fedcore.vertical.institution import InstitutionAgent
from fedcore.vertical.session import VerticalSession
from tests.conftest import mixed_table

pytestmark = pytest.mark.slow
KEY = b"fuzz-consortium-key-0123456789ab"
PARAMS = ForestParams(n_estimators=3, max_depth=4, random_state=2)


def _agents(tmp_path) -> dict[str, InstitutionAgent]:
    table = mixed_table(n_rows=300, seed=3)
    table.insert(0, "id", [f"R{i}" for i in range(len(table))])
    frames = split_vertical(table.drop(columns=["id"]), 2, label="target", seed=0)
    agents = {}
    for index, frame in enumerate(frames):
        name = f"p{index}"
        frame.insert(0, "id", table["id"])
        data = InstitutionData(name=name, frame=frame, id_column="id", label="target" if "target" in frame else None,
                               registry=tmp_path / name, predictions_dir=tmp_path / "pred" / name,
                               load_batch=lambda frame=frame: frame.drop(columns=["target"], errors="ignore"))
        agents[name] = InstitutionAgent(data, KEY)
    return agents


def _train(agents) -> tuple[VerticalSession, InProcessTransport]:
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=True)
    transport.exchange({n: Message("validation_report") for n in agents})
    session = VerticalSession(transport, PARAMS, min_overlap=10)
    session.align()
    session.train()
    return session, transport


def _perturb_array(data: st.DataObject, array: np.ndarray) -> np.ndarray:
    choice = data.draw(st.sampled_from(["huge", "negative", "shorter", "longer", "float", "empty", "random"]))
    flat = np.array(array).reshape(-1)
    if choice == "empty":
        return flat[:0]
    if choice == "shorter":
        return flat[: max(len(flat) // 2, 0)]
    if choice == "longer":
        return np.concatenate([flat, flat[:7]]) if len(flat) else np.arange(7)
    if choice == "float":
        return flat.astype(np.float64) + 0.5
    values = flat.astype(np.int64) if flat.dtype.kind in "iub" else flat.copy()
    if len(values):
        where = data.draw(st.integers(0, len(values) - 1))
        values[where] = {"huge": 2**31 - 1, "negative": -3, "random": data.draw(st.integers(-50, 10**6))}[choice]
    return values


def _perturb_header(data: st.DataObject, header: dict) -> dict:
    header = dict(header)
    if header:
        key = data.draw(st.sampled_from(sorted(header)))
        header[key] = data.draw(st.one_of(st.integers(-5, 10**9), st.none(), st.text(max_size=5),
                                          st.lists(st.integers(-3, 50), max_size=4)))
    return header


def test_perturbed_messages_never_crash_or_hang_an_agent(tmp_path) -> None:
    agents = _agents(tmp_path)
    session, transport = _train(agents)
    reference = session.master.structure
    recorded = [Message.from_bytes(e.payload) for e in transport.transcript
                if e.sender == "master" and e.receiver == "p1"]
    prefix = recorded[:[m.kind for m in recorded].index("begin_batch") + 1]  # a session up to its first level
    target = agents["p1"]
    slowest, outcomes = [0.0], {"answered": 0, "refused": 0}

    @settings(max_examples=1500, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.data())
    def one(data) -> None:
        original = data.draw(st.sampled_from(recorded))
        arrays = {name: (_perturb_array(data, a) if data.draw(st.booleans()) else a)
                  for name, a in original.arrays.items()}
        header = _perturb_header(data, original.header) if data.draw(st.booleans()) else original.header
        message = Message(original.kind, header, arrays)
        for step in prefix:  # the agent in a real session's state, then the perturbed message
            target.handle(step)
        started = time.perf_counter()
        try:
            target.handle(Message.from_bytes(message.to_bytes()))
            outcomes["answered"] += 1
        except Exception:  # refused or failed: the point is that it returns
            outcomes["refused"] += 1
        slowest[0] = max(slowest[0], time.perf_counter() - started)

    one()
    assert slowest[0] < 5.0, f"a perturbed message kept the agent busy for {slowest[0]:.1f} s"
    # about 100 of the 1,500 come through unrefused; the exact count moves a little with the order tests run
    # in (something under the handlers draws from the global `random`, which hypothesis reports)
    assert min(outcomes.values()) > 50, f"the fuzz must reach the handlers, not only the parser: {outcomes}"
    again, _ = _train(agents)  # a new session on the same agents is unaffected
    for field in ("tree", "node", "left", "right", "value"):
        assert np.array_equal(getattr(again.master.structure, field), getattr(reference, field))
