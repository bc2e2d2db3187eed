"""What the hot transitions cost the database: a cancel is the operator waiting, so it
is one guarded statement plus its event, in one transaction (one commit)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import transitions
from runs.models import Run, RunEvent
from runs.transitions import CancelOutcome

# Outside a test transaction, so atomic() is the outermost block and its BEGIN and
# COMMIT are captured too (Django logs them): the count is what the database sees.
pytestmark = pytest.mark.django_db(transaction=True)


def statements(queries):
    return [q["sql"].split(None, 3)[:3] for q in queries.captured_queries]


def test_request_cancel_of_a_live_run_is_one_update_and_its_event(running_run):
    run = running_run()
    with CaptureQueriesContext(connection) as queries:
        assert transitions.request_cancel(run.id, by="alice", note="stop") == CancelOutcome.REQUESTED
    assert [s[0].upper() for s in statements(queries)] == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    update, insert = (q["sql"] for q in queries.captured_queries[1:3])
    assert "RETURNING" in update and '"runs_run"' in update
    assert '"runs_runevent"' in insert
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.cancel_requested_by, row.cancel_note) == ("running", "alice", "stop")
    event = RunEvent.objects.get(run=run, kind="cancel_requested")
    assert (event.seq, event.actor, event.data) == (row.event_seq, "alice", {"status": "running", "note": "stop"})


def test_request_cancel_of_a_queued_run_settles_in_the_same_statement(make_run):
    run = make_run()
    with CaptureQueriesContext(connection) as queries:
        assert transitions.request_cancel(run.id, by="alice") == CancelOutcome.SETTLED
    # The UPDATE, its event, and the look for queued inputs an abnormal end resolves.
    assert [s[0].upper() for s in statements(queries)] == ["BEGIN", "UPDATE", "INSERT", "SELECT", "COMMIT"]
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.worker) == ("cancelled", "cancelled", "")
    assert row.finished_at is not None and row.finished_at >= row.cancel_requested_at
    event = RunEvent.objects.get(run=run, kind="cancel_requested")
    assert event.data == {"status": "cancelled", "reason": "cancelled", "note": "", "settled_queued": True}


def test_a_refused_request_reads_the_row_once_to_say_why(running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="alice")
    with CaptureQueriesContext(connection) as queries:
        assert transitions.request_cancel(run.id, by="bob") == CancelOutcome.ALREADY_REQUESTED
    assert [s[0].upper() for s in statements(queries)] == ["BEGIN", "UPDATE", "COMMIT", "SELECT"]
    assert Run.objects.get(pk=run.id).cancel_requested_by == "alice"


def test_every_guarded_winner_reads_its_row_from_the_update(running_run):
    run = running_run()
    with CaptureQueriesContext(connection) as queries:
        assert transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    assert [s[0].upper() for s in statements(queries)] == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
