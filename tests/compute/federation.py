"""North's three-party horizontal federation with the data an agent loaded, and the in-process comparison.

The agent-on-Dask tests load north's data twice (in process, then on workers), run the same session on
each and require the same forest, held-out evaluation and written predictions (`same_outcome`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fedcore.horizontal.agent import HorizontalInstitutionAgent
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.protocol.messages import Message
from tests.horizontal.test_session import _agents, _session


def refuse_readers(monkeypatch) -> None:
    """Every way the agent could read rows in its process fails (the threaded workers read with pyarrow)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the agent read rows")

    for target in ("fedcore.agents.data.read_files", "fedcore.data.io.read_table", "pandas.read_parquet",
                   "pandas.read_csv"):
        monkeypatch.setattr(target, refuse)


def predict_local() -> Message:
    """The master's request that an agent predict its own new batch."""
    return Message("predict_local")


@dataclass
class Outcome:
    """What one run of north's federation gave."""

    model: Any
    metrics: dict
    holdout_rows: object
    written: pd.DataFrame  # north's predictions as written (a file, or a folder of parts)
    reply: Message  # north's answer to predict_local
    agents: dict[str, HorizontalInstitutionAgent]
    columns: list[str]  # the agreed schema's columns


def run_north(data, table: pd.DataFrame, run: Path, contract, params: ExtraTreesParams | None = None,
              monkeypatch=None) -> Outcome:
    """Train, evaluate and predict with `data` as north's (south and east from `table`), then close.

    With `monkeypatch`, north's process may read no rows from training to its predictions
    (`refuse_readers`).
    """
    agents = _agents(table, run, contract)
    agents["north"] = HorizontalInstitutionAgent(data, identity=agents["north"].identity)
    session = _session(agents)
    if params is not None:
        session.params = params
    columns = list(session.agree_schema().names)
    if monkeypatch is not None:
        refuse_readers(monkeypatch)
    session.train()
    metrics = session.evaluate()
    reply = agents["north"].handle(predict_local())
    if monkeypatch is not None:
        monkeypatch.undo()
    path = Path(reply.header["path"])
    written = (pd.concat([pd.read_parquet(p) for p in sorted(path.iterdir())], ignore_index=True)
               if path.is_dir() else pd.read_parquet(path))
    outcome = Outcome(session.model, metrics, session.facts.holdout_rows, written, reply, agents, columns)
    session.close()
    return outcome


def same_outcome(got: Outcome, expected: Outcome) -> None:
    """The same forest, evaluation, held-out rows and predictions, exactly."""
    assert got.model.same_as(expected.model)
    assert got.metrics == expected.metrics and got.holdout_rows == expected.holdout_rows
    pd.testing.assert_frame_equal(got.written, expected.written, check_exact=True)
