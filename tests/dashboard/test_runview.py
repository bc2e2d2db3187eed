"""The run pages' helpers judge "stuck" and "not honoured" on the database clock."""

from datetime import timedelta

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from dashboard import runview
from runs import rules, transitions
from runs.models import Run

pytestmark = pytest.mark.django_db
OPERATOR = runview.Access(can_cancel=True)


@pytest.fixture
def server_clock(monkeypatch):
    """Set this web server's clock `offset` away from the database's."""
    real = timezone.now

    def skew(offset):
        monkeypatch.setattr(timezone, "now", lambda: real() + offset)

    return skew


@pytest.mark.parametrize("offset", [timedelta(hours=1), timedelta(hours=-1)])
def test_a_beating_run_is_not_stuck_on_a_skewed_server(running_run, server_clock, offset):
    run = running_run()
    Run.objects.filter(pk=run.pk).update(heartbeat_at=rules.stale_before(timedelta(0)))
    server_clock(offset)
    run = runview.get_run(run.id)
    context = runview.header_context(run, OPERATOR)
    assert (context["stuck"], context["buttons"]["retire"]) == (False, False)
    assert "stuck" not in render_to_string("runs/_heartbeat.html", {"run": run})


def test_a_silent_run_is_stuck_even_when_the_server_clock_lags(running_run, server_clock, settings):
    settings.RUNWARDEN_STUCK_S = 60
    run = running_run()
    Run.objects.filter(pk=run.pk).update(heartbeat_at=rules.stale_before(timedelta(minutes=5)))
    server_clock(timedelta(minutes=-10))  # by this server's clock the beat is in the future
    run = runview.get_run(run.id)
    assert runview.header_context(run, OPERATOR)["stuck"] is True
    assert "stuck" in render_to_string("runs/_heartbeat.html", {"run": run})
    assert 'class="row' in runview.render_row(run, OPERATOR, False) and " stuck" in runview.render_row(
        run, OPERATOR, False
    )


def test_retire_is_offered_once_a_cancel_is_not_honoured_by_the_database_clock(running_run, server_clock, settings):
    settings.RUNWARDEN_CANCEL_GRACE_S = 30
    run = running_run()
    Run.objects.filter(pk=run.pk).update(heartbeat_at=rules.stale_before(timedelta(0)))
    transitions.request_cancel(run.id, by="op")
    server_clock(timedelta(hours=1))  # by this clock the cancel is an hour old
    assert runview.header_context(runview.get_run(run.id), OPERATOR)["buttons"]["retire"] is False
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=rules.stale_before(timedelta(seconds=31)))
    assert runview.header_context(runview.get_run(run.id), OPERATOR)["buttons"]["retire"] is True
