"""heartbeat_many: a worker beats all its runs at once and hears every pending cancel."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import transitions
from runs.models import Run
from tests.runs.conftest import STATUSES

LIVE = ("running", "waiting_for_input", "waiting_for_approval")
STALE = timezone.now() - timedelta(hours=1)


def age(runs):
    Run.objects.filter(pk__in=[r.id for r in runs]).update(heartbeat_at=STALE)


@pytest.mark.django_db
def test_heartbeat_many_answers_the_whole_status_table_in_one_call(run_in):
    runs = {status: run_in(status) for status in STATUSES}
    age(runs.values())
    answers = transitions.heartbeat_many([r.id for r in runs.values()], worker="w1")
    for status, run in runs.items():
        beat = answers[run.id]
        assert (beat.held, beat.status) == (status in LIVE, status), status
        assert beat == transitions.heartbeat(run.id, worker="w1"), status  # the single-run verb agrees
        # Only the held ones were beaten: a queued or ended run keeps its old heartbeat.
        beaten = Run.objects.get(pk=run.id).heartbeat_at
        assert (beaten > STALE) is (status in LIVE), status


@pytest.mark.django_db
def test_heartbeat_many_carries_pending_cancels_and_keeps_the_cancel_pending(run_in):
    asked, quiet = run_in("running"), run_in("waiting_for_approval")
    assert transitions.request_cancel(asked.id, by="op") == transitions.CancelOutcome.REQUESTED
    answers = transitions.heartbeat_many([asked.id, quiet.id], worker="w1")
    assert (answers[asked.id].held, answers[asked.id].cancel_requested) == (True, True)
    assert (answers[quiet.id].held, answers[quiet.id].cancel_requested) == (True, False)
    assert Run.objects.get(pk=asked.id).status == "running"  # a beat never settles anything


@pytest.mark.django_db
def test_heartbeat_many_never_beats_another_workers_run(run_in):
    mine, theirs = run_in("running"), run_in("running")
    Run.objects.filter(pk=theirs.id).update(worker="w2")
    age([mine, theirs])
    answers = transitions.heartbeat_many([mine.id, theirs.id], worker="w1")
    assert answers[mine.id].held and not answers[theirs.id].held
    assert answers[theirs.id].status == "running"
    assert Run.objects.get(pk=theirs.id).heartbeat_at == STALE


@pytest.mark.django_db
def test_heartbeat_many_answers_unknown_and_malformed_ids_not_held(run_in):
    run = run_in("running")
    missing = uuid.uuid4()
    answers = transitions.heartbeat_many([run.id, missing, "not-a-uuid", str(run.id)], worker="w1")
    assert answers[run.id].held and answers[str(run.id)].held  # asked for as given
    for bad in (missing, "not-a-uuid"):
        assert answers[bad] == transitions.Heartbeat(held=False, cancel_requested=False, status="")
    assert transitions.heartbeat_many([], worker="w1") == {}


@pytest.mark.django_db
def test_heartbeat_many_is_one_statement_for_many_runs_on_postgresql(run_in):
    runs = [run_in("running") for _ in range(50)]
    with CaptureQueriesContext(connection) as queries:
        answers = transitions.heartbeat_many([r.id for r in runs], worker="w1")
    assert all(answers[r.id].held for r in runs)
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN"))]
    # PostgreSQL: one UPDATE … RETURNING inside a CTE. Elsewhere an UPDATE and one SELECT.
    assert len(statements) == (1 if connection.vendor == "postgresql" else 2), statements
    assert "UPDATE" in statements[0].upper()


@pytest.mark.django_db(transaction=True)
def test_heartbeat_many_never_waits_for_a_row_another_transaction_holds(run_in, postgres):
    import threading

    from django.db import connections, transaction

    busy, free = run_in("running"), run_in("running")
    age([busy, free])
    locked, release = threading.Event(), threading.Event()

    def hold():  # a step commit (or a settle) of `busy`, mid-transaction
        try:
            with transaction.atomic():
                list(Run.objects.select_for_update().filter(pk=busy.id))
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # waiting would fail the test, not hang it
        answers = transitions.heartbeat_many([busy.id, free.id], worker="w1")
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    finally:
        release.set()
        holder.join(10)
    # Answered from the snapshot (held, no cancel), beaten next interval; the free one now.
    assert answers[busy.id].held and answers[free.id].held
    assert Run.objects.get(pk=busy.id).heartbeat_at == STALE
    assert Run.objects.get(pk=free.id).heartbeat_at > STALE
