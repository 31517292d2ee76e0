"""The batches an institution delivered: each batch's `:since` is the latest delivered `until` before it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fedcore.agents.batches import LEDGER, BatchLedger
from fedcore.data.sql import SqlSource
from fedcore.errors import DataReadError

START = datetime(2026, 1, 1, tzinfo=UTC)
DAY = [START + timedelta(days=d) for d in range(5)]


def _ledger(tmp_path, parameters=("since", "until")) -> BatchLedger:
    source = SqlSource(("env", "DB"), query="SELECT 1", parameters=parameters, since=START)
    return BatchLedger.beside(tmp_path / "registry", source)


def test_since_is_the_latest_delivered_until_before_the_batch_and_retries_read_their_own(tmp_path) -> None:
    ledger = _ledger(tmp_path)
    assert ledger.window(DAY[1], "bank") == {"since": START, "until": DAY[1]}, "the first batch: sql.since"
    ledger.delivered(DAY[1])
    assert ledger.window(DAY[2], "bank") == {"since": DAY[1], "until": DAY[2]}
    assert ledger.window(DAY[2], "bank") == {"since": DAY[1], "until": DAY[2]}, "undelivered: read again"
    ledger.delivered(DAY[2])
    ledger.delivered(DAY[4])
    assert ledger.window(DAY[2], "bank") == {"since": DAY[1], "until": DAY[2]}, "a retry reads its own rows"
    assert ledger.window(DAY[3], "bank") == {"since": DAY[2], "until": DAY[3]}, "a late run its own"
    assert ledger.window(DAY[4] + timedelta(microseconds=1), "bank")["since"] == DAY[4]
    assert [p.name for p in (tmp_path / "registry").iterdir()] == [LEDGER], "no temporary file left"


def test_only_the_querys_placeholders_are_bound_and_a_batch_needs_its_scheduled_time(tmp_path) -> None:
    assert _ledger(tmp_path, ("until",)).window(DAY[1], "bank") == {"until": DAY[1]}
    with pytest.raises(DataReadError) as refused:
        _ledger(tmp_path).window(None, "bank")
    assert str(refused.value) == (
        "institution 'bank': its predict_data query selects a batch by :since/:until, but this prediction "
        "carries no scheduled time: run it with the batch-predict flow (or fedforest predict)")
