"""The batches an institution delivered: each batch's `:since` is the latest delivered `until` before it.

Kept per model and per query (its statement and bound names): another model, or an edited query, has
batches of its own; a ledger of the earlier format (no model, no query) counts for the current query.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest

from fedcore.agents.batches import LEDGER, BatchLedger
from fedcore.data.sql import SqlSource
from fedcore.errors import DataReadError

START = datetime(2026, 1, 1, tzinfo=UTC)
DAY = [START + timedelta(days=d) for d in range(5)]
QUERY = "SELECT * FROM new WHERE t > :since AND t <= :until"
CHURN, UPSELL = ("churn", "v0001"), ("upsell", "v0003")


def _ledger(tmp_path, parameters=("since", "until"), query=QUERY) -> BatchLedger:
    source = SqlSource(("env", "DB"), query=query, parameters=parameters, since=START)
    return BatchLedger.beside(tmp_path / "registry", source, "bank")


def test_since_is_the_latest_delivered_until_before_the_batch_and_retries_read_their_own(tmp_path) -> None:
    ledger = _ledger(tmp_path)
    assert ledger.window(CHURN, DAY[1]) == {"since": START, "until": DAY[1]}, "the first batch: sql.since"
    ledger.delivered(CHURN, DAY[1])
    assert ledger.window(CHURN, DAY[2]) == {"since": DAY[1], "until": DAY[2]}
    assert ledger.window(CHURN, DAY[2]) == {"since": DAY[1], "until": DAY[2]}, "undelivered: read again"
    ledger.delivered(CHURN, DAY[2])
    ledger.delivered(CHURN, DAY[4])
    assert ledger.window(CHURN, DAY[2]) == {"since": DAY[1], "until": DAY[2]}, "a retry reads its own rows"
    assert ledger.window(CHURN, DAY[3]) == {"since": DAY[2], "until": DAY[3]}, "a late run its own"
    assert ledger.window(CHURN, DAY[4] + timedelta(microseconds=1))["since"] == DAY[4]
    assert [p.name for p in (tmp_path / "registry").iterdir()] == [LEDGER], "no temporary file left"


def test_two_models_sharing_a_query_each_have_their_own_batches(tmp_path) -> None:
    ledger = _ledger(tmp_path)
    ledger.delivered(CHURN, DAY[1])
    ledger.delivered(CHURN, DAY[2])
    assert ledger.window(UPSELL, DAY[2]) == {"since": START, "until": DAY[2]}, "upsell delivered nothing yet"
    ledger.delivered(UPSELL, DAY[2])
    ledger.delivered(("upsell", "v0004"), DAY[3])  # a new version of a model continues its batches
    assert ledger.window(UPSELL, DAY[4])["since"] == DAY[3]
    assert ledger.window(CHURN, DAY[4])["since"] == DAY[2], "churn's batches did not move"
    assert ledger.window(("churn", "v0002"), DAY[4])["since"] == DAY[2]


def test_an_edited_query_starts_again_from_sql_since(tmp_path) -> None:
    _ledger(tmp_path).delivered(CHURN, DAY[1])
    edited = _ledger(tmp_path, query=QUERY + " AND region = 'north'")
    assert edited.window(CHURN, DAY[2]) == {"since": START, "until": DAY[2]}
    edited.delivered(CHURN, DAY[2])
    assert _ledger(tmp_path).window(CHURN, DAY[3])["since"] == DAY[1], "the first query keeps its batches"
    assert edited.window(CHURN, DAY[3])["since"] == DAY[2]
    swapped = _ledger(tmp_path, ("until", "since"), "SELECT * FROM new WHERE t > :until AND t <= :since")
    assert swapped.source.select() == _ledger(tmp_path).source.select(), "the same statement: $1, $2"
    assert swapped.window(CHURN, DAY[3])["since"] == START, "other names bound to $1, $2: another query"


def test_a_ledger_of_the_earlier_format_counts_for_the_current_query_of_every_model(tmp_path, caplog) -> None:
    path = tmp_path / "registry" / LEDGER
    path.parent.mkdir()
    path.write_text(json.dumps({"delivered": [DAY[1].isoformat(timespec="microseconds")]}))
    ledger = _ledger(tmp_path)
    with caplog.at_level(logging.WARNING, "fedcore.agents.batches"):
        assert ledger.window(CHURN, DAY[2]) == {"since": DAY[1], "until": DAY[2]}
    assert caplog.messages == [
        f"institution 'bank': the batch ledger {path} of an earlier fedforest keeps 1 delivered batches "
        "without their model or query: they are taken as its current predict_data query's, for every model "
        "(if that query changed since, delete the file: each query's next batch then starts from its "
        "sql.since)"]
    ledger.delivered(CHURN, DAY[2])
    assert json.loads(path.read_text())["format"] == 2
    assert ledger.window(CHURN, DAY[3])["since"] == DAY[2]
    assert ledger.window(UPSELL, DAY[2])["since"] == DAY[1], "the earlier batches count for every model"
    edited = _ledger(tmp_path, query=QUERY + " AND region = 'north'")
    assert edited.window(CHURN, DAY[2])["since"] == START, "not for a query edited after they were read"
    caplog.clear()
    with caplog.at_level(logging.WARNING, "fedcore.agents.batches"):
        ledger.window(UPSELL, DAY[3])
    assert caplog.messages == [], "said once: the ledger is in the new format since its first delivery"


def test_only_the_querys_placeholders_are_bound_and_a_batch_needs_its_time_and_model(tmp_path) -> None:
    assert _ledger(tmp_path, ("until",)).window(CHURN, DAY[1]) == {"until": DAY[1]}
    with pytest.raises(DataReadError) as refused:
        _ledger(tmp_path).window(CHURN, None)
    assert str(refused.value) == (
        "institution 'bank': its predict_data query selects a batch by :since/:until, but this prediction "
        "carries no scheduled time: run it with the batch-predict flow (or fedforest predict)")
    with pytest.raises(DataReadError) as refused:
        _ledger(tmp_path).window(None, DAY[1])
    assert str(refused.value) == (
        "institution 'bank': its predict_data query selects a batch by :since/:until, kept per model: "
        "predict with a stored model version (store the trained model, or load one)")


def test_a_ledger_fedforest_did_not_write_is_one_line_naming_it(tmp_path) -> None:
    path = tmp_path / "registry" / LEDGER
    path.parent.mkdir()
    for text in ("{not json", json.dumps({"format": 3, "ledgers": []}), json.dumps({"delivered": ["x"]})):
        path.write_text(text)
        with pytest.raises(DataReadError) as refused:
            _ledger(tmp_path).window(CHURN, DAY[1])
        assert str(refused.value) == (
            f"institution 'bank': the batch ledger {str(path)!r} is not one this fedforest writes: restore "
            "it, or delete it (each query's next batch then starts from its sql.since)")
