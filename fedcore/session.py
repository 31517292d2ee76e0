"""Master-side session steps every setting shares: agreeing where a checkpointed run resumes, collecting
the institutions' model digests for the signed manifest, storing a version everywhere or nowhere, and
closing the session."""

from __future__ import annotations

import json
import logging

from fedcore.checkpoints import CheckpointStore, resume_point
from fedcore.errors import FedForestError
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport

log = logging.getLogger(__name__)


class MasterSession:
    """A session with the institutions reachable through `transport`."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._checkpoints: CheckpointStore | None = None

    def agree_resume_point(self, store: CheckpointStore, run_id: str) -> int:
        """Ask every institution which tree batches of run `run_id` it checkpointed (under the store's
        context), and tell all of them to resume after the last batch everyone, the master included, has."""
        replies = self.transport.exchange({n: Message("resume_status", {"run": run_id, "context": store.context})
                                           for n in self.institutions})
        done = [list(r.arrays["completed"].astype(int)) for r in replies.values()]
        resumed = resume_point(store.completed(), *done)
        self.transport.exchange({n: Message("resume", {"batches": resumed}) for n in self.institutions})
        self._checkpoints = store
        return resumed

    def drop_checkpoints(self) -> None:
        """Remove the run's checkpoints at the master and every institution (once its version is stored)."""
        if self._checkpoints is not None:
            self.transport.exchange({n: Message("drop_checkpoints") for n in self.institutions})
            self._checkpoints.drop()
            self._checkpoints = None

    @property
    def institutions(self) -> list[str]:
        """Names of the institutions in this session."""
        return self.transport.parties

    def model_digests(self) -> dict[str, str]:
        """Every institution's SHA-256 of the model file it will store, for the master to sign."""
        replies = self.transport.exchange({name: Message("model_digest") for name in self.institutions})
        return {name: str(reply.header["sha256"]) for name, reply in replies.items()}

    def store_at_institutions(self, model_name: str, version: str, manifest: dict) -> dict[str, str]:
        """Ask every institution to store its model under the master's version. If any cannot, those that did
        withdraw theirs again and the error is raised: a version is stored everywhere or nowhere."""
        header = {"model": model_name, "version": version, "manifest": json.dumps(manifest, default=str)}
        try:
            replies = self.transport.exchange({name: Message("store_model", header) for name in self.institutions})
        except FedForestError:
            self.withdraw_at_institutions(model_name, version)
            raise
        return {name: r.header["path"] for name, r in replies.items()}

    def withdraw_at_institutions(self, model_name: str, version: str) -> None:
        """Best effort: every institution that stored `version` takes it back (one unreachable is skipped)."""
        header = {"model": model_name, "version": version}
        for name in self.institutions:
            try:
                self.transport.exchange({name: Message("withdraw_model", header)})
            except FedForestError:
                log.warning("could not withdraw %s %s at %s", model_name, version, name)

    def close(self) -> None:
        """Tell the agents the session is over."""
        self.transport.exchange({name: Message("close") for name in self.institutions})
