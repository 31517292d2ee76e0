"""What both settings' simulation estimators share when they run a whole federation in one process.

The run options (`progress`, `record_transcript`, `record_payloads`), the in-process transport between the
master and the party objects, the timed master fit with every role's memory planned against one budget, and
what crossed that transport (`communication_`, `rounds_`, `transcript_`).

A fitted estimator pickles (`pickle`, `joblib`) and unpickles to the same predictions and fitted attributes:
the fit's progress bar is dropped when the fit ends, and each party pickles without its session's secrets
(signing identity, sealing and masking keys, encrypted-label state and its worker processes), which only
training uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Protocol

from fedcore.estimator_api import EstimatorBase, NotFittedError, check_fitted
from fedcore.progress import ProgressCallback, end_line, progress_bar
from fedcore.transport.base import Transport
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.budget import resolve_budget


class _Member(Protocol):
    """A party object the transport delivers to: its name and its message handler."""

    name: str

    def handle(self, message: Any) -> Any: ...


class _Master(Protocol):
    """A master the estimator runs: its budget is set, then `fit` grows the forest over its transport."""

    transport: Transport
    shared_budget: int | None
    progress: ProgressCallback | None
    grower: Any  # the fit's LevelwiseGrower (None before one exists), which reports to `progress` too

    def fit(self) -> Any: ...


class SimulatedFederation(EstimatorBase):
    """Base of both settings' estimators: one process plays every role over an in-process transport.

    The vertical setting's prediction crosses the transport too, so its rounds add to training's; the
    horizontal setting predicts locally.
    """

    _task = "classification"
    _concurrent_parties = False
    """Whether a round's parties answer side by side (`InProcessTransport`); off: measured on 2 cores, it
    saved wall time only under heavy load (vertical boosting) or cost CPU (FET, PPD-ERT), session 49."""
    progress: bool
    record_transcript: bool
    record_payloads: bool
    transport_: InProcessTransport

    def _progress_callback(self) -> ProgressCallback | None:
        """A progress bar on stderr when `progress=True`."""
        return progress_bar() if self.progress else None

    def _in_process_transport(self, members: Iterable[_Member]) -> InProcessTransport:
        """The transport to `members`, recording the transcript (and payloads) when asked."""
        return InProcessTransport({member.name: member.handle for member in members},
                                  record_transcript=self.record_transcript,
                                  record_payloads=self.record_payloads, concurrent=self._concurrent_parties)

    def _fit_master(self, master: _Master, memory_budget_mb: int | None) -> Any:
        """`master.fit()`, with every role's memory counted against one budget, timed into `fit_seconds_`."""
        master.shared_budget = resolve_budget(memory_budget_mb)  # one process for every role
        started = time.perf_counter()
        try:
            fitted = master.fit()
        finally:
            # the bar ends with the fit: it writes to a stream, which would keep the estimator from pickling
            master.progress = None
            if master.grower is not None:
                master.grower.progress = None
            if self.progress:
                end_line()
            master.transport.close()  # its round threads end with the fit
        self.fit_seconds_ = time.perf_counter() - started
        return fitted

    @property
    def communication_(self) -> dict:
        """Rounds and bytes so far, in total and per message kind."""
        check_fitted(self)
        return self.transport_.stats.to_dict()

    @property
    def rounds_(self) -> int:
        """Round trips so far."""
        check_fitted(self)
        return self.transport_.stats.rounds

    @property
    def transcript_(self) -> list:
        """Every message that crossed (with payload bytes when record_payloads=True)."""
        check_fitted(self)
        if not self.transport_.record_transcript:
            raise NotFittedError("no transcript: fit with record_transcript=True (or record_payloads=True)")
        return self.transport_.transcript
