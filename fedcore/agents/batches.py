"""Which prediction batches an institution delivered: the `:since` and `:until` of its next batch query.

A `predict_data` query may select the rows of one scheduled batch (`... WHERE signup_at > :since AND
signup_at <= :until`). `:until` is the flow run's scheduled time (the master sends it as a value, checked
here to be a timestamp); `:since` is the latest `until` this institution delivered before it, kept in a
small JSON file beside its registry and recorded only after a delivery succeeded (`BatchLedger.delivered`).
A retried run (same scheduled time) therefore reads the same rows again, and a failed one is read again by
its retry; the first batch starts at the query's `sql.since`.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fedcore.data.sql import SqlSource, timestamp
from fedcore.errors import DataReadError, ProtocolError
from fedcore.files import DATA, write_file

LEDGER = ".prediction-batches.json"
"""The ledger's file name inside the institution's registry folder (hidden: no model is named so)."""
KEPT = 10_000
"""Delivered batches remembered (the newest): a retry of an older one reads from the oldest kept."""


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
    """The `until`s of the batches an institution delivered, in `path` (sorted ISO 8601 UTC strings)."""

    path: Path
    source: SqlSource

    @classmethod
    def beside(cls, registry: Path, source: SqlSource) -> BatchLedger:
        """The ledger of the institution whose registry folder is `registry`."""
        return cls(registry / LEDGER, source)

    def _delivered(self) -> list[str]:
        if not self.path.exists():
            return []
        return list(json.loads(self.path.read_text())["delivered"])

    def window(self, until: datetime | None, institution: str) -> dict[str, datetime]:
        """The values of the batch that ends at `until`: since = the latest delivered `until` before it."""
        if until is None:
            raise DataReadError(f"institution {institution!r}: its predict_data query selects a batch by "
                                ":since/:until, but this prediction carries no scheduled time: run it with "
                                "the batch-predict flow (or fedforest predict)")
        delivered = self._delivered()
        earlier = delivered[:bisect.bisect_left(delivered, _text(until))]
        since = datetime.fromisoformat(earlier[-1]) if earlier else self.source.since
        values = {"until": until} | ({"since": since} if since is not None else {})
        return {name: values[name] for name in self.source.parameters}

    def delivered(self, until: datetime) -> None:
        """Record that the batch ending at `until` was delivered (atomically: a temporary file renamed)."""
        stamps = sorted({*self._delivered(), _text(until)})[-KEPT:]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        write_file(tmp, json.dumps({"delivered": stamps}).encode(), DATA)
        tmp.replace(self.path)


def _text(stamp: datetime) -> str:
    """A UTC timestamp as the ledger keeps it: ISO 8601 to the microsecond, so text order is time order."""
    return stamp.isoformat(timespec="microseconds")
