"""Where a vertical agent on Dask spends a session's time: its answers and its cluster's tasks (issue #29).

`Timeline` records, in an agent process, when each protocol message's answer started and ended (wall
clock) and its LocalCluster's task stream (Dask's `get_task_stream`: per task, its worker and the seconds
it spent computing, transferring its inputs and deserialising them). Written as JSON per agent by
`bench_dask_scale --run vertical-dask --timeline DIR`; this module's main prints, per agent, each answer
with its seconds and the tasks' compute seconds by kind (the key's prefix) that ran during it:

    .venv/bin/python -m benchmarks.timeline DIR
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.agent_profile import _kind
from benchmarks.markdown import markdown_table


class Timeline:
    """An agent's answers (kind, start, stop) and, on Dask, its cluster's task stream."""

    def __init__(self, client: Any) -> None:
        """Start the task stream of `client`'s cluster (None: an in-process agent, answers only)."""
        self.answers: list[dict] = []
        self._stream = None
        if client is not None:
            from distributed import get_task_stream

            self._stream = get_task_stream(client)
            self._stream.__enter__()

    def wrap(self, server: Any) -> None:
        """Time every answer of `server` (`_answer`, until its last piece is sent)."""
        answer = server._answer

        def timed(payload, stamp):
            start, kind = time.time(), _kind(payload)
            try:
                pieces = answer(payload, stamp)  # at once: a request read part by part is read here
            except BaseException:
                self.answers.append({"kind": kind, "start": start, "stop": time.time()})
                raise
            return self._sent(pieces, kind, start)

        server._answer = timed

    def _sent(self, pieces, kind: str, start: float):
        """The answer's pieces; its stop is when the last is sent (a streamed answer is made then)."""
        try:
            yield from pieces
        finally:
            self.answers.append({"kind": kind, "start": start, "stop": time.time()})

    def write(self, path: Path) -> None:
        """The answers and the tasks, as JSON at `path`."""
        tasks = []
        if self._stream is not None:
            from dask.utils import key_split

            self._stream.__exit__(None, None, None)
            tasks = [{"kind": key_split(t["key"]), "worker": t["worker"],
                      "startstops": [{k: s[k] for k in ("action", "start", "stop")} for s in t["startstops"]]}
                     for t in self._stream.data]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"answers": self.answers, "tasks": tasks}))


def summary(record: dict) -> list[dict]:
    """Per answer: its kind and seconds, and the seconds the tasks that started during it spent per action."""
    spans: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    answers = sorted(record["answers"], key=lambda a: a["start"])
    for task in record["tasks"]:
        for step in task["startstops"]:
            at = [i for i, a in enumerate(answers) if a["start"] <= step["start"] < a["stop"]]
            where = at[0] if at else -1
            label = task["kind"] if step["action"] == "compute" else step["action"]
            spans[where][label] += step["stop"] - step["start"]
    def largest(i: int) -> str:
        work = sorted(spans.get(i, {}).items(), key=lambda kv: -kv[1])
        return ", ".join(f"{k} {v:.2f}" for k, v in work[:6])

    rows = [{"#": i, "answer": a["kind"], "seconds": f"{a['stop'] - a['start']:.2f}",
             "tasks' seconds (summed over workers)": largest(i)} for i, a in enumerate(answers)]
    if -1 in spans:
        rows.append({"#": "-", "answer": "(between answers)", "seconds": "",
                     "tasks' seconds (summed over workers)": largest(-1)})
    return rows


def main() -> None:
    """Print each agent's timeline summary from a `--timeline` folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    args = parser.parse_args()
    for path in sorted(Path(args.folder).glob("*.json")):
        print(f"\n{path.stem}:\n")
        print(markdown_table(summary(json.loads(path.read_text()))))


if __name__ == "__main__":
    main()
