"""Which prediction batches an institution delivered: the `:since` and `:until` of its next batch query.

A `predict_data` query may select the rows of one scheduled batch (`... WHERE signup_at > :since AND
signup_at <= :until`). `:until` is the flow run's scheduled time (the master sends it as a value, checked
here to be a timestamp); `:since` is the latest `until` this institution delivered before it for the same
model and the same query, kept in a small JSON file beside its registry and recorded only after a delivery
succeeded (`BatchLedger.delivered`). A retried run (same scheduled time) therefore reads the same rows
again, and a failed one is read again by its retry; the first batch starts at the query's `sql.since`.

The batches are kept per model name (of the version the agent stored or loaded) and per query: a digest
of the statement the server runs and of the names bound to its $1, $2, ... (the institution's own config),
so two models predicting with one query each have their own batches, and an edited query starts again at
its `sql.since`. A ledger of the earlier format (one list for the whole institution, no model or query) is
taken as the current query's, for every model, and says so in one logged line.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fedcore.data.sql import SqlSource, timestamp
from fedcore.errors import DataReadError, ProtocolError
from fedcore.files import DATA, write_file

log = logging.getLogger(__name__)

LEDGER = ".prediction-batches.json"
"""The ledger's file name inside the institution's registry folder (hidden: no model is named so)."""
FORMAT = 2
"""`{"format": 2, "batches": {model: {query digest: [until, ...]}}}`, and `"earlier": {"query_sha256": ...,
"delivered": [...]}` after reading a format-1 ledger (`{"delivered": [...]}`): its batches, for any model."""
KEPT = 10_000
"""Delivered batches remembered per model and query (the newest): a retry of an older one reads from the
oldest kept."""


def requested_until(institution: str, header: dict) -> datetime | None:
    """The scheduled time a prediction request carries (`until`, ISO 8601 with a time zone), in UTC.

    Checked when the request arrives: it is bound as a query value, never written into SQL.
    """
    value = header.get("until")
    if value is None:
        return None
    stamp = timestamp(value) if isinstance(value, str) else None
    if stamp is None:
        raise ProtocolError(f"institution {institution!r}: until {str(value)[:40]!r} is not a timestamp "
                            "with a time zone (ISO 8601)")
    return stamp


@dataclass(frozen=True)
class BatchLedger:
    """The `until`s of the batches an institution delivered, in `path`, per model and per `source` query."""

    path: Path
    source: SqlSource
    institution: str

    @classmethod
    def beside(cls, registry: Path, source: SqlSource, institution: str) -> BatchLedger:
        """The ledger of the institution whose registry folder is `registry`."""
        return cls(registry / LEDGER, source, institution)

    @property
    def query_sha256(self) -> str:
        """The digest of the statement `source` runs and the names bound to its $1, $2, ... (in order)."""
        statement = json.dumps([self.source.select(), list(self.source.parameters)])
        return hashlib.sha256(statement.encode()).hexdigest()

    def window(self, version: tuple[str, str] | None, until: datetime | None) -> dict[str, datetime]:
        """The values of the batch that ends at `until` for `version`'s model (model, version), its query's.

        since = the latest `until` delivered before it for that model and query (none yet: `sql.since`).
        """
        if until is None:
            raise DataReadError(f"institution {self.institution!r}: its predict_data query selects a batch "
                                "by :since/:until, but this prediction carries no scheduled time: run it "
                                "with the batch-predict flow (or fedforest predict)")
        ledger = self._read(announce=True)
        delivered = self._delivered(ledger, self._model(version))
        earlier = delivered[:bisect.bisect_left(delivered, _text(until))]
        since = datetime.fromisoformat(earlier[-1]) if earlier else self.source.since
        values = {"until": until} | ({"since": since} if since is not None else {})
        return {name: values[name] for name in self.source.parameters}

    def delivered(self, version: tuple[str, str] | None, until: datetime) -> None:
        """Record that `version`'s model delivered the batch ending at `until` (atomically: file renamed)."""
        ledger, model = self._read(), self._model(version)
        queries = ledger["batches"].setdefault(model, {})
        queries[self.query_sha256] = sorted({*queries.get(self.query_sha256, []), _text(until)})[-KEPT:]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        write_file(tmp, json.dumps(ledger, indent=1, sort_keys=True).encode(), DATA)
        tmp.replace(self.path)

    def _model(self, version: tuple[str, str] | None) -> str:
        """The model name the batches are kept under: the version's this agent stored or loaded."""
        if version is None:
            raise DataReadError(f"institution {self.institution!r}: its predict_data query selects a batch "
                                "by :since/:until, kept per model: predict with a stored model version "
                                "(store the trained model, or load one)")
        return version[0]

    def _delivered(self, ledger: dict, model: str) -> list[str]:
        """The sorted `until`s delivered for `model` and this query (with those a format-1 ledger kept)."""
        own = ledger["batches"].get(model, {}).get(self.query_sha256, [])
        earlier = ledger.get("earlier", {})
        inherited = earlier.get("delivered", []) if earlier.get("query_sha256") == self.query_sha256 else []
        return sorted({*own, *inherited})

    def _read(self, announce: bool = False) -> dict:
        """The ledger in this format (empty if absent); a format-1 one attributed to this query.

        `announce`: log, in one line, how a format-1 ledger is read.
        """
        if not self.path.exists():
            return {"format": FORMAT, "batches": {}}
        try:
            ledger = json.loads(self.path.read_text())
            if ledger.get("format") == FORMAT and isinstance(ledger["batches"], dict):
                return dict(ledger)
            if set(ledger) != {"delivered"}:
                raise ValueError
            delivered = [_text(datetime.fromisoformat(stamp)) for stamp in ledger["delivered"]]
        except (ValueError, TypeError, KeyError, AttributeError):
            raise DataReadError(f"institution {self.institution!r}: the batch ledger {str(self.path)!r} is "
                                "not one this fedforest writes: restore it, or delete it (each query's next "
                                "batch then starts from its sql.since)") from None
        if announce:
            log.warning("institution %r: the batch ledger %s of an earlier fedforest keeps %d delivered "
                        "batches without their model or query: they are taken as its current predict_data "
                        "query's, for every model (if that query changed since, delete the file: each "
                        "query's next batch then starts from its sql.since)", self.institution,
                        str(self.path), len(delivered))
        return {"format": FORMAT, "batches": {},
                "earlier": {"query_sha256": self.query_sha256, "delivered": delivered}}


def _text(stamp: datetime) -> str:
    """A UTC timestamp as the ledger keeps it: ISO 8601 to the microsecond, so text order is time order."""
    return stamp.isoformat(timespec="microseconds")
