"""An agent on Dask reads the master's `align` positions part by part (issue #29).

The master sends the positions as a `StreamedMessage` of parts; the agent gets a `PartedMessage` (the
request read batch by batch, `fedcore.protocol.parted`) and plans the aligned blocks part by part. The forest
is the in-process agent's, byte for byte; a hostile master's parts are refused with the whole message's
checks, each with its exact error.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

from fedcore.errors import MalformedMessage, ProtocolError
from fedcore.privacy import psi as psi_module
from fedcore.protocol.messages import Message, PartedMessage, StreamedMessage, pack_bits
from fedcore.protocol.parted import read_request
from fedcore.transport.base import Transport
from fedcore.transport.flight import chunk_buffers, join_pieces
from fedcore.vertical import session as session_module
from fedcore.vertical.agent import VerticalInstitutionAgent
from tests.compute import test_vertical_parquet as parquet
from tests.vertical.test_session import _agents


class PartedTransport(Transport):
    """Delivers requests as an AgentServer does: read batch by batch, parted for a kind the agent streams."""

    def __init__(self, handlers: dict, agents: dict | None = None) -> None:
        """Deliver to `handlers` (the agents' `handle`, or wrappers of it: then pass the `agents`)."""
        super().__init__()
        self.handlers = handlers
        self.agents = agents or {name: handler.__self__ for name, handler in handlers.items()}
        self.parted: list[tuple[str, int]] = []  # (kind, parts) of each request delivered parted

    @property
    def parties(self) -> list[str]:
        return list(self.agents)

    def _deliver(self, requests: dict[str, pa.Buffer]) -> dict[str, pa.Buffer]:
        replies = {}
        for party, payload in requests.items():
            agent = self.agents[party]
            message = read_request(iter(chunk_buffers(payload)), agent.streams, join_pieces)
            if isinstance(message, PartedMessage):
                counted = _Counted(message.parts)
                message.parts = counted
                reply = self.handlers[party](message)
                assert next(message.parts, None) is None, "the agent read every part"
                self.parted.append((message.kind, counted.n))
            else:
                reply = self.handlers[party](message)
            replies[party] = reply.to_buffer()
        return replies


class _Counted:
    def __init__(self, parts) -> None:
        self.parts, self.n = parts, 0

    def __iter__(self):
        return self

    def __next__(self):
        part = next(self.parts)
        self.n += 1
        return part


@pytest.mark.parametrize("alignment", ["hash", pytest.param("psi", marks=pytest.mark.slow)])  # psi: 2 runs
def test_align_read_part_by_part_trains_the_in_process_forest(scenario, tmp_path, three_workers, monkeypatch,
                                                              alignment) -> None:
    """The forest of `align` sent whole: by in-process agents (hash), by Dask agents (PSI).

    PSI draws fresh secrets each session, so a fresh canonical order: both runs get the same secrets.
    """
    secrets: list[bytes] = []
    if alignment == "hash":
        expected = parquet._train(_agents(scenario, tmp_path / "local", new_batch=False), "none")
    else:
        drawn = psi_module.new_secret

        def recorded() -> bytes:
            secrets.append(drawn())
            return secrets[-1]

        monkeypatch.setattr(psi_module, "new_secret", recorded)
        whole = parquet._parquet_agents(scenario, tmp_path / "whole", three_workers)
        expected = parquet._train(whole, "none", "psi")
        replayed = iter(list(secrets))
        monkeypatch.setattr(psi_module, "new_secret", lambda: next(replayed))
    monkeypatch.setattr(session_module, "ALIGN_PART_ROWS", 64)  # ~300 aligned rows: about 5 parts
    monkeypatch.setattr(session_module, "PSI_PART_ROWS", 64)  # each institution's ~400 IDs: about 7 parts
    transports: list[PartedTransport] = []

    def transport(handlers: dict) -> PartedTransport:
        transports.append(PartedTransport(handlers))
        return transports[-1]

    monkeypatch.setattr(parquet, "InProcessTransport", transport)
    got = parquet._train(parquet._parquet_agents(scenario, tmp_path / "dask", three_workers), "none",
                         alignment)
    assert got[1] == expected[1]
    assert got[0].keys() == expected[0].keys()
    for name in expected[0]:
        assert got[0][name] == expected[0][name], name
    parted = transports[0].parted
    reblinds = ["psi_reblind"] * 6 if alignment == "psi" else []  # 3 lists, each re-blinded by 2 others
    assert [kind for kind, _ in parted] == reblinds + ["align"] * 3
    assert all(n >= 4 for _, n in parted), parted


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    from fedcore.data.scenario import make_vertical_scenario

    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=600, seed=3)


@pytest.fixture()
def agent(scenario, tmp_path, three_workers) -> VerticalInstitutionAgent:
    """A passive institution's agent on Dask, its session started (ready for align)."""
    agents = parquet._parquet_agents(scenario, tmp_path, three_workers)
    name = next(n for n in agents if n != scenario["label_holder"])
    agent = agents[name]
    agent.handle(Message("validation_report"))
    agent.handle(Message("id_hashes"))
    return agent


def _align(agent: VerticalInstitutionAgent, rows: int, parts: list[np.ndarray],
           holdout: np.ndarray | None = None) -> Message:
    """`align` as a hostile master streams it: `parts` as they come, whatever `rows` announces."""
    holdout = np.zeros(rows, np.uint8) if holdout is None else holdout
    request = StreamedMessage("align", {"rows": rows}, "positions", (sum(len(p) for p in parts),),
                              lambda: iter(parts), {"holdout": pack_bits(holdout)})
    message = read_request(request.pieces(), agent.streams, join_pieces)
    assert isinstance(message, PartedMessage)
    return agent.handle(message)


def test_a_request_longer_than_it_announced_is_refused_at_the_part_past_it(agent) -> None:
    n = agent.data.table.n_rows
    parts = [np.arange(0, 100), np.arange(100, 200), np.arange(200, 300)]
    read = []

    def logged():
        for part in parts:
            read.append(len(part))
            yield part

    request = StreamedMessage("align", {"rows": 150}, "positions", (300,), logged,
                              {"holdout": pack_bits(np.zeros(150, np.uint8))})
    message = read_request(request.pieces(), agent.streams, join_pieces)
    with pytest.raises(ProtocolError, match=re.escape(
            f"institution {agent.name!r}: 'align' announces 150 rows but carries more positions "
            "(200 so far)")):
        agent.handle(message)
    assert n > 300 and agent.party is None
    assert read == [100, 100]  # refused at the part past it: the third was never read


def test_a_request_shorter_than_it_announced_is_refused(agent) -> None:
    with pytest.raises(ProtocolError, match=re.escape(
            f"institution {agent.name!r}: 'align' announces 300 rows but carries 200 positions")):
        _align(agent, 300, [np.arange(0, 100), np.arange(100, 200)])
    assert agent.party is None


def test_a_part_of_the_wrong_dtype_is_refused(agent) -> None:
    with pytest.raises(MalformedMessage, match=re.escape(
            f"institution {agent.name!r} refuses a malformed 'align' message: array 'positions' must be of "
            "dtype kind 'iu', 1-dimensional: found float64 of shape [100]")):
        _align(agent, 200, [np.arange(0, 100, dtype=np.float64), np.arange(100, 200, dtype=np.float64)])
    # (an IPC stream has one schema: a part of another dtype than the first cannot follow it)


def test_positions_out_of_range_are_refused(agent) -> None:
    n = agent.data.table.n_rows
    with pytest.raises(ProtocolError, match=re.escape(
            f"alignment positions run from {n - 50} to {n + 49}, outside this party's {n} rows")):
        _align(agent, 200, [np.arange(0, 100), np.arange(n - 50, n + 50)])
    with pytest.raises(ProtocolError, match=re.escape(
            f"alignment positions run from -1 to 98, outside this party's {n} rows")):
        _align(agent, 100, [np.arange(-1, 99)])


@pytest.mark.parametrize("parts", [[np.arange(0, 100), np.arange(50, 150)],  # across parts
                                   [np.concatenate([np.arange(0, 99), [5]]), np.arange(100, 200)]])  # within
def test_repeated_positions_are_refused(agent, parts) -> None:
    with pytest.raises(ProtocolError, match=re.escape(
            "alignment positions repeat a row; each row may appear once")):
        _align(agent, 200, parts)


def test_holdout_bits_not_of_the_announced_rows_are_refused(agent) -> None:
    with pytest.raises(MalformedMessage, match=re.escape(
            f"institution {agent.name!r} refuses a malformed 'align' message: array 'holdout' must be of "
            "dtype kind 'u', 1-dimensional, 25 long: found uint8 of shape [2]")):
        _align(agent, 200, [np.arange(0, 200)], holdout=np.zeros(16, np.uint8))


def test_a_hostile_announcement_is_refused_before_any_part_is_read(agent) -> None:
    read = []

    def logged():
        read.append(1)
        yield np.arange(0, 10)

    request = StreamedMessage("align", {"rows": 10 ** 12}, "positions", (10,), logged,
                              {"holdout": pack_bits(np.zeros(8, np.uint8))})
    message = read_request(request.pieces(), agent.streams, join_pieces)
    read.clear()  # the first part is read with the request's first batch
    with pytest.raises(MalformedMessage, match=re.escape("array 'holdout' must be of dtype kind 'u', "
                                                         "1-dimensional, 125000000000 long")):
        agent.handle(message)
    assert read == []


# -- psi_reblind: another institution's blinded list, read part by part ----------------------------------
@pytest.fixture()
def psi_agent(agent) -> VerticalInstitutionAgent:
    """The passive institution's agent on Dask after PSI's first step (its IDs blinded on the workers)."""
    agent.handle(Message("psi_blinded"))
    return agent


def _points(n: int, seed: int = 0) -> np.ndarray:
    """`n` valid blinded points (X25519 u-coordinates of random scalars' multiples are any 32 bytes here)."""
    return np.random.default_rng(seed).integers(0, 256, (n, 32), dtype=np.uint8)


def _reblind(agent: VerticalInstitutionAgent, rows: int, parts: list[np.ndarray]) -> np.ndarray:
    """`psi_reblind` as a master streams it (`parts`, announcing `rows`), the answer read whole."""
    shape = (sum(len(p) for p in parts), *parts[0].shape[1:])  # as the stream declares it
    request = StreamedMessage("psi_reblind", {"rows": rows}, "values", shape, lambda: iter(parts), {},
                              dtype=parts[0].dtype)
    message = read_request(request.pieces(), agent.streams, join_pieces)
    assert isinstance(message, PartedMessage)
    return Message.from_bytes(agent.handle(message).to_buffer()).arrays["values"].reshape(-1, 32)


def test_a_list_re_blinded_part_by_part_is_the_list_re_blinded_whole(psi_agent) -> None:
    values = _points(300)
    whole = _reblind(psi_agent, 300, [values])
    parted = _reblind(psi_agent, 300, [values[:100], values[100:250], values[250:]])
    assert parted.tobytes() == whole.tobytes()
    assert whole.shape == (300, 32) and not np.array_equal(whole, values)


def test_a_re_blind_request_longer_than_it_announced_is_refused_at_the_part_past_it(psi_agent) -> None:
    parts, read = [_points(100, seed) for seed in range(3)], []

    def logged():
        for part in parts:
            read.append(len(part))
            yield part

    request = StreamedMessage("psi_reblind", {"rows": 150}, "values", (300, 32), logged, {}, dtype=np.uint8)
    message = read_request(request.pieces(), psi_agent.streams, join_pieces)
    with pytest.raises(ProtocolError, match=re.escape(
            f"institution {psi_agent.name!r}: 'psi_reblind' announces 150 rows but carries more values "
            "(200 so far)")):
        psi_agent.handle(message)
    assert read == [100, 100]  # refused at the part past it: the third was never read


def test_a_re_blind_request_shorter_than_it_announced_is_refused(psi_agent) -> None:
    with pytest.raises(ProtocolError, match=re.escape(
            f"institution {psi_agent.name!r}: 'psi_reblind' announces 300 rows but carries 200 values")):
        _reblind(psi_agent, 300, [_points(100), _points(100, 1)])


def test_re_blind_parts_that_are_not_32_byte_points_are_refused(psi_agent) -> None:
    with pytest.raises(MalformedMessage, match=re.escape(
            f"institution {psi_agent.name!r} refuses a malformed 'psi_reblind' message: array 'values' must "
            "hold 32-byte points, one a row")):
        _reblind(psi_agent, 200, [np.zeros((100, 16), np.uint8), np.zeros((100, 16), np.uint8)])
    with pytest.raises(MalformedMessage, match=re.escape(
            f"institution {psi_agent.name!r} refuses a malformed 'psi_reblind' message: array 'values' must "
            "be of dtype kind 'u', 2-dimensional: found int64 of shape [100, 32]")):
        _reblind(psi_agent, 100, [np.zeros((100, 32), np.int64)])


def test_a_whole_re_blind_request_must_carry_the_rows_it_announces(scenario, tmp_path) -> None:
    agents = _agents(scenario, tmp_path, new_batch=False)  # in-process agents read every request whole
    agent = next(a for name, a in agents.items() if name != scenario["label_holder"])
    agent.handle(Message("validation_report"))
    agent.handle(Message("psi_blinded"))
    with pytest.raises(ProtocolError, match=re.escape(
            f"institution {agent.name!r}: 'psi_reblind' announces 5 rows but carries 4 values")):
        agent.handle(Message("psi_reblind", {"rows": 5}, {"values": _points(4)}))
    with pytest.raises(ProtocolError, match=re.escape(
            f"institution {agent.name!r}: 'psi_reblind' announces None rows")):
        agent.handle(Message("psi_reblind", {}, {"values": _points(4)}))
    assert agent.handle(Message("psi_reblind", {"rows": 4}, {"values": _points(4)})).kind == "psi_reblinded"


@pytest.mark.parametrize(("rows", "parts", "error"), [
    (150, [np.arange(0, 100), np.arange(100, 200)], "'align_batch' announces 150 rows but carries more "
                                                    "positions (200 so far)"),
    (300, [np.arange(0, 100), np.arange(100, 200)], "'align_batch' announces 300 rows but carries 200 "
                                                    "positions"),
    (0, [np.arange(0, 0)], "'align_batch' aligns 0 rows, fewer than this institution's min_overlap=1"),
    (200, [np.arange(0, 100), np.arange(50, 150)],
     "alignment positions repeat a row; each row may appear once"),
    (100, [np.arange(-1, 99)], "alignment positions run from -1 to 98, outside this party's {n} rows")])
def test_a_hostile_align_batch_is_refused_part_by_part_as_align_is(agent, rows, parts, error) -> None:
    n = agent.data.table.n_rows
    _align(agent, n, [np.arange(n)])  # a party to predict with
    agent._batch = agent.data.table  # a batch on the workers (here the table itself)
    request = StreamedMessage("align_batch", {"rows": rows}, "positions", (sum(len(p) for p in parts),),
                              lambda: iter(parts))
    message = read_request(request.pieces(), agent.streams, join_pieces)
    assert isinstance(message, PartedMessage)
    with pytest.raises(ProtocolError) as refused:
        agent.handle(message)
    prefix = "" if error.startswith("alignment") else f"institution {agent.name!r}: "
    assert str(refused.value) == prefix + error.format(n=n)
    assert agent._batch_ids is None
