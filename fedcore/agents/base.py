"""The institution agent's base, shared by both settings.

Session start and validation report, engine messages passed to the party with batch checkpoints, the
batch drift check, withdrawal and close.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import pandas as pd

from fedcore.agents.data import InstitutionData
from fedcore.agents.drift import check_batch
from fedcore.agents.storage import model_version, withdraw_version
from fedcore.checkpoints import CheckpointStore
from fedcore.contracts.expectations import ValidationReport
from fedcore.drift import batch_scores
from fedcore.errors import FedForestError, MalformedMessage, ProtocolError, internal_error
from fedcore.models.registry import ModelRegistry
from fedcore.protocol.messages import Header, Message


class EngineParty(Protocol):
    """What an agent needs of its engine's party: it answers the engine's messages."""

    def handle(self, message: Message) -> Message:
        """The party's reply to one engine message."""
        ...


log = logging.getLogger(__name__)

PartyT = TypeVar("PartyT", bound=EngineParty)
SHARED_HEADERS: dict[str, tuple[str, ...]] = {
    "validation_report": (), "evaluate": ("decision_threshold",), "model_digest": (),
    "store_model": ("model", "version", "manifest"), "load_model": ("model", "version", "table_sha256"),
    "resume_status": ("run", "context"), "resume": ("batches",), "drop_checkpoints": (),
    "withdraw_model": ("model", "version"), "close": ()}
"""The header fields of the session messages both settings' agents answer."""


def session_headers(**fields: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """Header fields per session message kind: those every agent answers (SHARED_HEADERS), plus `fields`."""
    return {kind: frozenset(names) for kind, names in {**SHARED_HEADERS, **fields}.items()}


PREDICTION_KINDS = frozenset({"deliver_predictions", "predict_local"})
"""The messages that write a predictions file: answered once per model version a session holds."""


def validation_reply(report: ValidationReport | None) -> Message:
    """The contract result for the master: pass/fail and counts per expectation, never example values."""
    if report is None:
        return Message("validation", {"checked": False, "success": True, "rows": [], "errors": []})
    rows = [{k: row[k] for k in ("expectation", "column", "success", "unexpected_count", "expected")}
            for row in report.rows]
    return Message("validation", {"checked": True, "success": report.success, "rows": rows,
                                  "errors": report.failure_lines(), "contract": report.contract,
                                  "contract_version": report.version})


class SessionAgent(Generic[PartyT]):
    """What every institution agent does around its engine, in either setting.

    Reload the data at each session start and report its validation, pass engine messages to the party
    (checkpointing the batch just finished first), dispatch the others to `_on_<kind>`, withdraw a version,
    and close.

    Subclasses name their engine's message kinds, reset their own session state in `_start_session`, and
    say what a finished batch's checkpoint holds (`_batch_checkpoint`).
    """

    engine_kinds: frozenset[str] = frozenset()
    not_ready = "no party yet"
    """Why an engine message that arrives before the party exists is refused."""
    session_headers: dict[str, frozenset[str]] = {}
    """Per session message kind, the header fields it may carry; any other field is refused (a peer's
    string never becomes a path here). A kind not listed is checked by its handler."""

    def __init__(self, data: InstitutionData | Callable[[], InstitutionData], name: str = "") -> None:
        """An agent for the institution's table `data`, or for a loader called afresh at every session start.

        With a loader, a long-lived agent trains each session on the data as it is then.
        """
        self._loader = data if callable(data) else None
        self._data = None if callable(data) else data
        self.name = data.name if not callable(data) else name
        self.party: PartyT | None = None
        self._checkpoints: CheckpointStore | None = None  # once the master asked to resume or checkpoint
        self.closed = False
        self.sessions = 0
        self.model_ref: tuple[str, str] | None = None
        """(model, version) this agent stored or loaded in this session: what its predictions are named by."""
        self.decision_threshold: float | None = None
        """The decision threshold of the version it predicts with (its master manifest's; None: argmax)."""
        self._stored: tuple[str, str] | None = None
        """(model, version) this agent stored in this session: the only one a master may withdraw."""
        self._done: set[str] = set()
        """Session message kinds answered in this session that may be answered only once (`_once`)."""
        self.snapshot: dict | None = None
        """The drift snapshot of the training rows of the version stored or loaded (`fedcore.drift`)."""
        self.reports: dict[str, list[dict]] = {}
        """Tables for this institution's own eyes, shown in its agent run (its features' importances, a
        batch's drift): by name, rows of JSON-ready values. Never sent to the master."""

    @property
    def data(self) -> InstitutionData:
        """The institution's table for this session (loaded at its start when a loader was given)."""
        if self._data is None:
            raise ProtocolError("institution agent: session not started (no validation_report yet)")
        return self._data

    def handle(self, message: Message) -> Message:
        """Dispatch a session message, or pass an engine message to the party."""
        if self._data is None and message.kind != "validation_report":
            raise ProtocolError(f"institution agent: session not started ({message.kind!r} "
                                "before validation_report)")
        if message.kind in self.engine_kinds:
            self._require_party(message.kind)
            if "save_batch" in message.header and self._checkpoints is not None:
                # the batch just finished, before the next one (or the final model) changes anything
                self._checkpoints.save(message.header.int("save_batch"), self._batch_checkpoint())
            return self._engine_reply(message)
        handler = getattr(self, f"_on_{message.kind}", None)
        if handler is None:
            raise ProtocolError(f"institution {self.name!r} cannot handle message kind {message.kind!r}")
        self._check_header(message)
        try:
            return handler(message)
        except MalformedMessage as error:  # as the dispatcher does for a party (fedcore.protocol.dispatch)
            raise MalformedMessage(f"institution {self.name!r} refuses a malformed {message.kind!r} message: "
                                   f"{error}") from error
        except FedForestError:  # a refusal or a named failure (the institution's data)
            raise
        except Exception as error:
            raise internal_error(log, self.name, message.kind, error) from error

    def _check_header(self, message: Message) -> None:
        """Refuse header fields a session message of this kind does not have (see `session_headers`)."""
        allowed = self.session_headers.get(message.kind)
        if allowed is None:
            return
        unknown = sorted(set(message.header) - allowed)
        if unknown:
            raise ProtocolError(f"institution {self.name!r} refuses {message.kind!r} with header field(s) "
                                f"{unknown}: it takes {sorted(allowed) or 'none'} (an agent names its own "
                                "files and reads its own settings)")

    def _once(self, kind: str) -> None:
        """Refuse a second `kind` message in this session (align, setup, evaluate, load_holdout, ...)."""
        if kind in self._done:
            raise ProtocolError(f"institution {self.name!r} refuses a second {kind!r} in this session: it is "
                                "answered once per session")
        self._done.add(kind)

    def _stored_version(self, header: Header, master_manifest: dict) -> None:
        """This session stored `header`'s version here: predictions are named by it; it may be withdrawn."""
        self._model_version(header, master_manifest)
        self._stored = self.model_ref

    def _model_version(self, header: Header, master_manifest: dict) -> None:
        """The model version this session now predicts with (stored or loaded): one prediction file each.

        Its batch predictions use the decision threshold its master's signed manifest states (binary labels).
        """
        self.model_ref = model_version(header)
        self._done -= PREDICTION_KINDS
        threshold = master_manifest.get("decision_threshold")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)
                                      or not 0 <= threshold <= 1):
            raise ProtocolError(f"institution {self.name!r}: the version's decision_threshold must be a "
                                "number in [0, 1]")
        self.decision_threshold = None if threshold is None else float(threshold)

    def _keep_snapshot(self, snapshot: dict | None, extra: dict) -> None:
        """At store: the training rows' drift snapshot, for this session and the registry copy (`extra`).

        None (no training rows here): batch drift is not checked (`fedcore.drift`).
        """
        self.snapshot = snapshot
        if snapshot is not None:
            extra["drift"] = snapshot

    def _batch_drift(self, batch: pd.DataFrame) -> dict[str, dict[str, float]]:
        """The reply header field naming this batch's drifted features (`fedcore.agents.drift`)."""
        return self._drift_reply(None if self.snapshot is None else batch_scores(self.snapshot, batch))

    def _drift_reply(self, scores: dict[str, float] | None) -> dict[str, dict[str, float]]:
        """`_batch_drift` from the batch's scores (None: not checked), however they were computed."""
        return {"drift": check_batch(self.name, self.data.drift, scores, self.reports)}

    def _prediction_target(self) -> tuple[str, str] | None:
        """The (model, version) predictions are named by; None for a model trained here but not stored."""
        return self.model_ref

    def _require_party(self, kind: str) -> PartyT:
        """The engine's party, or the refusal of a `kind` message that needs it before it exists."""
        if self.party is None:
            raise ProtocolError(f"institution {self.name!r}: {self.not_ready} ({kind!r} too early)")
        return self.party

    def _engine_reply(self, message: Message) -> Message:
        return self._require_party(message.kind).handle(message)

    def _batch_checkpoint(self) -> dict:
        """The arrays this institution keeps for the tree batch it just finished."""
        raise NotImplementedError

    def _start_session(self) -> None:
        """Forget the previous session's state (the party and checkpoints are reset already)."""

    def _on_validation_report(self, message: Message) -> Message:
        """Start of a session.

        (re)load the data if a loader was given, then report its validation: pass/fail per expectation with
        counts, never the example values (they are raw data).
        """
        if self._loader is not None:
            self._data = self._loader()
            self.name = self._data.name
        self.party, self._checkpoints, self.closed = None, None, False
        self.model_ref, self._stored, self._done = None, None, set()
        self.decision_threshold = None
        self._start_session()
        self.sessions += 1
        return validation_reply(self.data.validation)

    def _on_withdraw_model(self, message: Message) -> Message:
        """Take back a version that could not be stored everywhere.

        Only the version this session stored here, or this institution's newest version of the model (what
        a run that crashed while registering leaves, which the next run withdraws), or one it does not hold
        (a no-op): a master may not remove the versions before the newest.
        """
        model, version = model_version(message.header)
        if (model, version) != self._stored:
            held = ModelRegistry(self.data.registry).versions(model)
            if version in held[:-1]:  # an older one it holds; the newest, or one it lacks (a no-op), may go
                raise ProtocolError(f"institution {self.name!r} withdraws only the version it stored in this "
                                    f"session or its newest one of the model, not {version!r}")
        self._stored = None
        return withdraw_version(self.data, message.header)

    def _on_close(self, message: Message) -> Message:
        self.closed = True
        return Message("ack")
