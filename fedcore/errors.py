"""Named errors raised by fedcore: each says who, what was expected and what was found."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path


class FedForestError(Exception):
    """Base class of every error fedcore raises on purpose."""


class InputError(FedForestError, ValueError):
    """The caller's data or parameters cannot be used; the message says how to fix it."""


class DataReadError(InputError):
    """A data file could not be read."""


class DataWriteError(InputError):
    """Predictions could not be written where the institution keeps them (nothing was written)."""


class ColumnNotFoundError(InputError):
    """A named column (label, id, feature) is absent."""


class PartyShapeError(InputError):
    """Vertical parties disagree on the number of rows, or a party is empty."""


class DuplicateColumnError(InputError):
    """The same column name is held by two parties (names must be unique across a federation)."""


class LabelHolderError(InputError):
    """No party, or more than one party, holds the label column."""


class LabelError(InputError):
    """The label cannot be learned from: one class, missing values, or a non-numeric regression target."""


class ParameterError(InputError):
    """A hyper-parameter is outside its allowed range."""


class NotFittedError(FedForestError, AttributeError, ValueError):
    """A model was used before `fit` (or `load`): an AttributeError and a ValueError, like scikit-learn's."""


class ProtocolError(FedForestError):
    """A party or the master received a message it cannot act on: the peer's fault, refused."""


class BatchDrift(ProtocolError):
    """An institution refuses to predict a batch whose features drifted from its training rows.

    With `drift: {on_drift: fail}` (issue #33); the message names the features and their PSI.
    """


class MalformedMessage(ProtocolError):
    """A message field is missing or of the wrong type, shape or range (found where the field is read).

    The dispatcher refuses the message with one line naming the field, never quoting its value.
    """


class InternalError(FedForestError, RuntimeError):
    """A bug in this process's own code while it answered a message (not the peer's fault).

    Its traceback is in this process's log; the peer is told only that an internal error occurred.
    """


class PartyUnavailable(FedForestError):
    """A party cannot be reached or stopped answering (its process died, the network failed).

    Not a ProtocolError: nobody misbehaved. Transient; a run can resume from its checkpoints once the party
    is back.
    """


CLUSTER_LOST = "lost its compute cluster"
"""The words by which a party's failure line says its own cluster went (the master maps it back to
ComputeUnavailable)."""


class ComputeUnavailable(PartyUnavailable):
    """A party lost its own compute cluster mid-work: its Dask scheduler connection closed or timed out.

    Or Dask gave up on tasks whose workers kept dying. Not a bug of the party's code and not the peer's
    fault: transient, as a party that stopped answering; a run resumes from its checkpoints once the cluster
    answers again.
    """


class AgentRunEnded(PartyUnavailable):
    """An institution's agent flow run ended before its agent served (its error is quoted).

    Or no worker of its pool picked it up in time (`training.agent_late_timeout_s`). Waiting for the agent
    or retrying the connection cannot help.
    """


class CertificateRefused(ProtocolError):
    """A mutual-TLS peer's certificate was refused (wrong CA, wrong identity, expired).

    Retrying cannot help.
    """


class KeyAuthenticationError(ProtocolError):
    """A party's secure-aggregation public key is not signed by that party's consortium identity.

    A bad or missing signature, a key signed for another session, or a certificate the consortium CA did not
    issue to that party: the key may have been substituted by the relay, so no mask is derived from it.
    """


class ArtifactError(FedForestError):
    """A saved model is missing files, was tampered with or has an unknown format."""


class ConfigError(InputError):
    """A federation config file is missing, malformed or inconsistent."""


class ContractMismatch(InputError):
    """The institutions of a horizontal federation declare different schemas in their data contracts.

    Their columns, dtypes, categories or label classes differ.
    """


class ContractViolation(InputError):
    """Data broke its contract: the message lists every failed expectation with institution and column."""

    def __init__(self, message: str, institution: str, failures: list[dict]) -> None:
        """`failures` lists what the contract check found wrong in `institution`'s data."""
        super().__init__(message)
        self.institution = institution
        self.failures = failures


def failure_summary(error: BaseException, frames: int = 3) -> str:
    """One line on an unexpected exception that quotes no value: its type and where it was raised.

    The text of a NumPy, pandas or Arrow exception may quote the data it failed on (a label, a cell), so an
    agent never logs or returns it; the innermost `frames` code locations say where to look instead.
    """
    stack = traceback.extract_tb(error.__traceback__)[-frames:]
    where = " <- ".join(f"{_source_name(Path(f.filename))}:{f.lineno} in {f.name}" for f in reversed(stack))
    return f"{type(error).__name__} at {where}" if where else type(error).__name__


def traceback_lines(error: BaseException) -> str:
    """`error`'s traceback as Python prints it, but with its text withheld (it may quote the party's data).

    The frames (file, line, function, source line) say where our own bug is; the exception's text, which a
    NumPy or pandas error may fill with a row's values, is left out of a log the consortium may read.
    """
    frames = "".join(traceback.format_list(traceback.extract_tb(error.__traceback__)))
    return (f"Traceback (most recent call last):\n{frames}{type(error).__name__} "
            "(its text is withheld: it may quote the institution's data)")


def internal_error(logger: logging.Logger, party: str, kind: str,
                   error: BaseException) -> InternalError | ComputeUnavailable:
    """Log an unexpected `error` raised while `party` answered a `kind` message; the error to raise instead.

    Our own bug: its traceback logged, one generic line for the peer naming no file, function or value. But
    an error that says the party's Dask cluster went away (`cluster_loss`) is no bug: ComputeUnavailable,
    which a retraining flow resumes from, with the cluster and what happened to it.
    """
    from fedcore.compute.cluster import cluster_loss  # lazily: the compute package imports this module

    loss = cluster_loss(error)
    if loss is not None:
        line = (f"party {party!r} {CLUSTER_LOST} while answering {kind!r}: {loss}; resume once it answers "
                "again")
        logger.error("%s", line)
        return ComputeUnavailable(line)
    logger.error("party %r failed on %r: a bug in its own code, not the peer's fault\n%s", party, kind,
                 traceback_lines(error))
    return InternalError(f"party {party!r} could not answer {kind!r}: an internal error (its traceback is in "
                         "that party's log)")


def _source_name(path: Path) -> str:
    """A source file as 'package/module.py' (its last two path parts): short, and no home folder."""
    return "/".join(path.parts[-2:])
