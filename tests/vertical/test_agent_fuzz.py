"""Fuzz an institution agent's message handling with messages a buggy or hostile master could send.

Real protocol messages from a training run with their arrays and header values perturbed by a seeded generator
(out-of-range and negative indices, wrong lengths and dtypes, huge counts). Every call must end, quickly, in
an answer or a Python exception (never a crash of the process or a hang), and afterwards a fresh session must
still train exactly as before.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.data.split import split_vertical
from fedcore.errors import FedForestError, InternalError
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.params import ForestParams
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.session import VerticalSession
from tests.conftest import mixed_table

pytestmark = pytest.mark.slow
KEY = b"fuzz-consortium-key-0123456789ab"
PARAMS = ForestParams(n_estimators=3, max_depth=4, random_state=2)
FUZZ_SEED, FUZZ_MESSAGES = 11, 1500


def _agents(tmp_path) -> dict[str, VerticalInstitutionAgent]:
    table = mixed_table(n_rows=300, seed=3)
    table.insert(0, "id", [f"R{i}" for i in range(len(table))])
    frames = split_vertical(table.drop(columns=["id"]), 2, label="target", seed=0)
    agents = {}
    for index, frame in enumerate(frames):
        name = f"p{index}"
        frame.insert(0, "id", table["id"])
        data = InstitutionData(name=name, frame=frame, id_column="id",
                               label="target" if "target" in frame else None, registry=tmp_path / name,
                               predictions_dir=tmp_path / "pred" / name,
                               load_batch=lambda frame=frame: frame.drop(columns=["target"], errors="ignore"))
        agents[name] = VerticalInstitutionAgent(data, KEY)
    return agents


def _train(agents) -> tuple[VerticalSession, InProcessTransport]:
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=True)
    transport.exchange({n: Message("validation_report") for n in agents})
    session = VerticalSession(transport, PARAMS, min_overlap=10)
    session.align()
    session.train()
    return session, transport


def _perturb_array(rng: np.random.Generator, array: np.ndarray) -> np.ndarray:
    choice = rng.choice(["huge", "negative", "shorter", "longer", "float", "empty", "random"])
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
        where = rng.integers(len(values))
        values[where] = {"huge": 2**31 - 1, "negative": -3,
                         "random": rng.integers(-50, 10**6, endpoint=True)}[choice]
    return values


def _perturb_header(rng: np.random.Generator, header: dict) -> dict:
    header = dict(header)
    if header:
        key = sorted(header)[rng.integers(len(header))]
        header[key] = [lambda: int(rng.integers(-5, 10**9, endpoint=True)), lambda: None,
                       lambda: "".join(rng.choice(list("ab\u00e9\u2028 0-"), size=rng.integers(6))),
                       lambda: [int(v) for v in rng.integers(-3, 50, size=rng.integers(5), endpoint=True)],
                       ][rng.integers(4)]()
    return header


@pytest.mark.timeout(120)  # about 5 s in all: a message that keeps the agent busy fails it, whatever the load
def test_perturbed_messages_never_crash_or_hang_an_agent(tmp_path) -> None:
    agents = _agents(tmp_path)
    session, transport = _train(agents)
    reference = session.master.structure
    recorded = [Message.from_bytes(e.payload) for e in transport.transcript
                if e.sender == "master" and e.receiver == "p1"]
    prefix = recorded[:[m.kind for m in recorded].index("begin_batch") + 1]  # a session up to its first level
    target = agents["p1"]
    # A correct agent must answer these unperturbed in this state: a new session's validation_report, and the
    # message that follows the prefix (begin_batch is the first level's search: its apply_splits, or the next
    # level's find_splits).
    valid_next = {i for i, m in enumerate(recorded) if m.kind == "validation_report"} | {len(prefix)}
    rng = np.random.default_rng(FUZZ_SEED)  # the only source of the perturbations (see the note below)
    outcomes, wrongly_refused, must_answer, internal = {"answered": 0, "refused": 0}, [], 0, []
    for _ in range(FUZZ_MESSAGES):
        index = int(rng.integers(len(recorded)))
        original, perturbed, arrays = recorded[index], False, {}
        for name, array in original.arrays.items():
            if rng.random() < 0.5:
                array, perturbed = _perturb_array(rng, array), True
            arrays[name] = array
        header = original.header
        if rng.random() < 0.5 and header:
            header, perturbed = _perturb_header(rng, header), True
        message = Message(original.kind, header, arrays)
        for step in prefix:  # the agent in a real session's state, then the perturbed message
            target.handle(step)
        try:
            target.handle(Message.from_bytes(message.to_bytes()))
            outcomes["answered"] += 1
        except Exception as exc:  # refused or failed: the point is that it returns
            outcomes["refused"] += 1
            # a message the master sent wrong is refused (or a named failure), never taken for our own bug
            if isinstance(exc, InternalError) or not isinstance(exc, FedForestError):
                internal.append(f"{original.kind}: {exc!r} from {exc.__cause__!r}")
            if not perturbed and index in valid_next:
                wrongly_refused.append(f"{original.kind}: {exc!r}")
        must_answer += not perturbed and index in valid_next
    # The perturbations come from one seeded generator, not from hypothesis: its draws mix in constants that
    # it harvests from every project module imported so far, so the stream, and with it the answered count,
    # changed with the order tests ran in and with edits anywhere in the code. Seeded, the counts are the
    # same in any order (measured alone, after other test files and in the full suite): 259 answered and
    # 1,241 refused, 101 of the answered being unperturbed messages valid in this state, which the first
    # assertion requires (99 once `align` announced its row count, issue #27). The other answered messages
    # (session messages and perturbed find_splits that
    # stay valid) depend on the party's order rules (422 before issue #11's refusals), so they are not
    # pinned; the floors say that the fuzz reaches the handlers with messages they must accept, and that
    # most perturbed messages are refused.
    assert not wrongly_refused, f"valid unperturbed messages were refused: {wrongly_refused[:3]}"
    assert not internal, f"perturbed messages taken for our own bugs: {internal[:3]}"
    # How many to expect: each valid-next message is drawn with probability 1/len(recorded) and left
    # unperturbed with probability 1/2 per array and 1/2 for a non-empty header. The count moves with the
    # seeded stream whenever a recorded message changes (it was 101 at an expectation near 100), so the
    # floor is three quarters of the expectation: about 2.5 standard deviations of that binomial below it.
    expected = sum(FUZZ_MESSAGES / len(recorded) * 0.5 ** (len(recorded[i].arrays) + bool(recorded[i].header))
                   for i in valid_next)
    assert must_answer >= 0.75 * expected, (f"only {must_answer} messages the agent must answer (about "
                                            f"{expected:.0f} expected): the fuzz hardly reaches it")
    assert outcomes["refused"] > 1000, f"most perturbed messages should be refused: {outcomes}"
    again, _ = _train(agents)  # a new session on the same agents is unaffected
    for field in ("tree", "node", "left", "right", "value"):
        assert np.array_equal(getattr(again.master.structure, field), getattr(reference, field))
