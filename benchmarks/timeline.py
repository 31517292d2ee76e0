"""Where a vertical agent on Dask spends a session's time: its answers and its cluster's tasks (issue #29).

`Timeline` records, in an agent process, when each protocol message's answer started and ended (wall
clock), the CPU seconds the agent process and its cluster's workers had used at both moments (so that a
phase's CPU can be compared across runs whatever the machine's load), and its LocalCluster's task stream
(Dask's `get_task_stream`: per task, its worker and the seconds it spent computing, transferring its inputs
and deserialising them). Written as JSON per agent by
`bench_dask_scale --run vertical-dask --timeline DIR`; this module's main prints, per agent, each answer
with its seconds and the tasks' compute seconds by kind (the key's prefix) that ran during it:

    .venv/bin/python -m benchmarks.timeline DIR
"""

from __future__ import annotations

import argparse
import json
import os
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
        self._client = client
        self._stream = None
        if client is not None:
            from distributed import get_task_stream

            self._stream = get_task_stream(client)
            self._stream.__enter__()

    def wrap(self, server: Any) -> None:
        """Time every answer of `server` (`_answer`, until its last piece is sent)."""
        answer = server._answer

        def timed(payload, stamp):
            start, kind, cpu = time.time(), _kind(payload), self.cpu()
            try:
                pieces = answer(payload, stamp)  # at once: a request read part by part is read here
            except BaseException:
                self.answers.append({"kind": kind, "start": start, "stop": time.time(), "cpu": cpu,
                                     "cpu_stop": self.cpu()})
                raise
            return self._sent(pieces, kind, start, cpu)

        server._answer = timed

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by this agent process and, summed, by its workers."""
        times = os.times()
        out = {"agent": times.user + times.system, "workers": 0.0}
        if self._client is not None:
            out["workers"] = sum(self._client.run(_process_cpu).values())
        return out

    def _sent(self, pieces, kind: str, start: float, cpu: dict[str, float]):
        """The answer's pieces; its stop is when the last is sent (a streamed answer is made then)."""
        try:
            yield from pieces
        finally:
            self.answers.append({"kind": kind, "start": start, "stop": time.time(), "cpu": cpu,
                                 "cpu_stop": self.cpu()})

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


def _process_cpu() -> float:
    """CPU seconds (user + system) this process used so far: run on each worker (`Client.run`)."""
    times = os.times()
    return times.user + times.system


def cpu_between(record: dict, first: str, last: str) -> dict[str, float] | None:
    """Agent's and workers' CPU seconds from the first `first` answer's start to the last `last`'s end.

    None: a record without CPU, or without those answers.
    """
    answers = sorted(record["answers"], key=lambda a: a["start"])
    starts = [a for a in answers if a["kind"] == first and "cpu" in a]
    stops = [a for a in answers if a["kind"] == last and "cpu_stop" in a]
    if not starts or not stops:
        return None
    return {k: stops[-1]["cpu_stop"][k] - starts[0]["cpu"][k] for k in ("agent", "workers")}


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
             "CPU s (agent, workers)": _cpu_text(a),
             "tasks' seconds (summed over workers)": largest(i)} for i, a in enumerate(answers)]
    if -1 in spans:
        rows.append({"#": "-", "answer": "(between answers)", "seconds": "", "CPU s (agent, workers)": "",
                     "tasks' seconds (summed over workers)": largest(-1)})
    return rows


def _cpu_text(answer: dict) -> str:
    """`1.20, 3.40`: the agent's and its workers' CPU seconds during the answer (blank: not recorded)."""
    if "cpu" not in answer:
        return ""
    return ", ".join(f"{answer['cpu_stop'][k] - answer['cpu'][k]:.2f}" for k in ("agent", "workers"))


def by_kind(record: dict) -> list[dict]:
    """Per kind of answer: how many, their wall seconds and the CPU seconds during them, summed."""
    totals: dict[str, list[float]] = {}
    for a in record["answers"]:
        row = totals.setdefault(a["kind"], [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += a["stop"] - a["start"]
        if "cpu" in a:
            row[2] += a["cpu_stop"]["agent"] - a["cpu"]["agent"]
            row[3] += a["cpu_stop"]["workers"] - a["cpu"]["workers"]
    return [{"answer": kind, "count": n, "seconds": f"{wall:.2f}", "agent CPU s": f"{agent:.2f}",
             "workers' CPU s": f"{workers:.2f}"} for kind, (n, wall, agent, workers) in totals.items()]


def main() -> None:
    """Print each agent's timeline summary from a `--timeline` folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    args = parser.parse_args()
    for path in sorted(Path(args.folder).glob("*.json")):
        record = json.loads(path.read_text())
        print(f"\n{path.stem}:\n")
        print(markdown_table(summary(record)))
        print()
        print(markdown_table(by_kind(record)))
        training = cpu_between(record, "setup", "finalize")
        if training is not None:
            print(f"\nCPU from setup's start to finalize's end: agent {training['agent']:.2f} s, workers "
                  f"{training['workers']:.2f} s")


if __name__ == "__main__":
    main()
