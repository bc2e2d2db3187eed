"""The run predicates of runs.rules: judged on the database clock, whatever ours says."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import rules, transitions
from runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock_ahead(monkeypatch):
    """This process's clock an hour ahead of the database's (a skewed web server)."""
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(hours=1))


def beat(run, ago):
    """Set the run's heartbeat `ago` before the database's now (not a status write)."""
    Run.objects.filter(pk=run.pk).update(heartbeat_at=rules.stale_before(ago))


def test_a_fresh_heartbeat_is_not_stuck_however_far_ahead_our_clock_is(running_run, clock_ahead):
    run = running_run()
    beat(run, timedelta(0))
    flagged = rules.with_flags(Run.objects.filter(pk=run.pk)).get()
    assert (flagged.flag_stuck, rules.is_stuck(flagged)) == (False, False)
    assert rules.is_stuck(Run.objects.get(pk=run.pk)) is False  # no annotation: asked once


def test_stuck_and_not_honoured_follow_their_thresholds(running_run, settings):
    settings.RUNWARDEN_STUCK_S, settings.RUNWARDEN_CANCEL_GRACE_S = 10, 30
    fresh, silent, ignored = running_run(), running_run(), running_run()
    beat(fresh, timedelta(seconds=1))
    beat(silent, timedelta(seconds=11))
    beat(ignored, timedelta(seconds=1))
    transitions.request_cancel(ignored.id, by="op")
    Run.objects.filter(pk=ignored.pk).update(cancel_requested_at=rules.stale_before(timedelta(seconds=31)))
    flags = {r.pk: (r.flag_stuck, r.flag_not_honoured) for r in rules.with_flags(Run.objects.all())}
    assert flags == {fresh.pk: (False, False), silent.pk: (True, False), ignored.pk: (False, True)}
    assert set(Run.objects.filter(rules.ABORTING).values_list("pk", flat=True)) == {ignored.pk}


def test_a_released_wait_is_never_stuck(released_in):
    run = released_in()
    Run.objects.filter(pk=run.pk).update(heartbeat_at=None)
    assert not Run.objects.filter(rules.stuck(timedelta(0)), pk=run.pk).exists()


def test_retryable_is_one_rule_for_the_list_triage_bulk_and_retry(run_in):
    failed, completed = run_in("failed"), run_in("completed")
    assert set(Run.objects.filter(rules.RETRYABLE).values_list("pk", flat=True)) == {failed.pk}
    assert transitions.retry(failed.id, by="op") is not None
    assert not Run.objects.filter(rules.RETRYABLE).exists()  # retried once: no longer offered
    assert completed.pk not in Run.objects.filter(rules.RETRYABLE).values_list("pk", flat=True)


def test_the_thresholds_are_read_from_settings_each_time(settings):
    settings.RUNWARDEN_STUCK_S = 7
    assert rules.thresholds().stuck == timedelta(seconds=7)
    assert rules.thresholds(stuck_s=2).stuck == timedelta(seconds=2)


def test_the_note_limit_is_the_columns():
    assert rules.NOTE_LIMIT == Run._meta.get_field("cancel_note").max_length == 500


def test_the_deadline_rule_asks_only_runs_past_it_on_the_database_clock(make_run, clock_ahead):
    due = make_run(deadline=timezone.now() - timedelta(hours=2))  # our clock: 1 h ago for the database
    later = make_run(deadline=timezone.now() - timedelta(minutes=30))  # past for us, 30 min ahead for it
    from runs import watchdog

    assert watchdog.stop_past_deadline(by="w9", source=Run.CancelSource.WORKER) == [due.id]
    row = Run.objects.get(pk=due.pk)
    assert (row.status, row.termination_reason, row.cancel_requested_by, row.cancel_source, row.cancel_note) == (
        "completed", "budget_exhausted", "w9", "worker", rules.DEADLINE_NOTE,
    )
    assert Run.objects.get(pk=later.pk).status == "queued"
    assert Run.objects.filter(rules.DEADLINE_PASSED).count() == 0
