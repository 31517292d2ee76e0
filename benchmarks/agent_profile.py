"""Where an agent process's memory goes, stage by stage (issue #29's vertical agent profile).

`StageProfile` wraps an `AgentServer`'s answer to each protocol message (parse, the party's work, the
reply's serialisation): per message kind, the process's peak RSS during the answer (Linux VmHWM, reset
before each answer through /proc/self/clear_refs), its RSS after, and tracemalloc's peak and retained
bytes of Python and NumPy allocations (Arrow's own pool is not traced; snapshots of the traces were tried
and are too slow beside the Dask scheduler this process runs). Used by
`benchmarks/profile_vertical_agent.py`.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

MIB = 2 ** 20


def _status(field: str) -> float:
    """A /proc/self/status memory field of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class StageProfile:
    """Per stage: peak and after RSS (MiB), traced peak and retained (MiB), seconds."""

    def __init__(self) -> None:
        """Start tracing (one frame per allocation: cheap enough for a benchmark agent)."""
        tracemalloc.start(1)
        self.rows: list[dict] = []
        self._peak = _status("VmHWM")
        _reset_peak()

    def peak_mib(self) -> float:
        """The largest peak RSS over every stage so far (VmHWM is reset per stage)."""
        return max([self._peak, _status("VmHWM"), *(r["peak_rss"] for r in self.rows)])

    def mark(self, stage: str) -> None:
        """Record the RSS reached since the last mark or stage, under `stage`."""
        self.rows.append({"stage": stage, "peak_rss": _status("VmHWM"), "rss": _status("VmRSS"),
                          "traced_peak": tracemalloc.get_traced_memory()[1] / MIB,
                          "traced": tracemalloc.get_traced_memory()[0] / MIB, "arrow": 0.0, "seconds": 0.0})
        self._peak = max(self._peak, self.rows[-1]["peak_rss"])
        _reset_peak()
        tracemalloc.reset_peak()

    def wrap(self, server) -> None:
        """Profile every protocol message `server` answers (`_answer`, until its last piece is sent)."""
        answer = server._answer

        def profiled(payload, stamp):
            _reset_peak()
            tracemalloc.reset_peak()
            start, kind = time.perf_counter(), _kind(payload)
            try:
                pieces = answer(payload, stamp)
            except BaseException:
                self._record(kind, start)
                raise
            return self._sent(kind, start, pieces)

        server._answer = profiled

    def _sent(self, kind: str, start: float, pieces):
        """The answer's pieces; the stage is recorded once they are sent (a streamed answer is made then)."""
        try:
            yield from pieces
        finally:
            self._record(kind, start)

    def _record(self, kind: str, start: float) -> None:
        import pyarrow as pa

        current, peak = tracemalloc.get_traced_memory()
        self.rows.append({"stage": kind, "peak_rss": _status("VmHWM"), "rss": _status("VmRSS"),
                          "traced_peak": peak / MIB, "traced": current / MIB,
                          "arrow": pa.total_allocated_bytes() / MIB, "seconds": time.perf_counter() - start})


def _kind(payload) -> str:
    from fedcore.protocol.messages import Message

    if isinstance(payload, Message):  # a request the agent reads part by part (issue #29)
        return payload.kind
    try:
        return Message.from_bytes(payload).kind
    except Exception:  # noqa: BLE001 - a profile names what it can
        return "?"


def merged(rows: list[dict]) -> list[dict]:
    """One row per stage name in first-seen order: the largest peak, the last RSS, summed seconds."""
    out: dict[str, dict] = {}
    for row in rows:
        seen = out.setdefault(row["stage"], {**row, "calls": 0, "seconds": 0.0})
        seen["calls"] += 1
        seen["seconds"] += row["seconds"]
        seen.update(rss=row["rss"], traced=row["traced"], arrow=row["arrow"])
        if row["peak_rss"] >= seen["peak_rss"]:
            seen.update(peak_rss=row["peak_rss"], traced_peak=row["traced_peak"])
    return list(out.values())
