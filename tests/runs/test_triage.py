"""Triage sections find exactly the runs that need an operator."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import transitions, triage
from runs.models import Run

pytestmark = pytest.mark.django_db


def ids(key):
    return [r.id for r in triage.section(key).runs]


def test_each_section_finds_its_runs(settings, make_run, running_run, run_in):
    settings.RUNWARDEN_STUCK_S = 5
    settings.RUNWARDEN_CANCEL_GRACE_S = 30
    stuck = running_run()
    Run.objects.filter(pk=stuck.id).update(heartbeat_at=timezone.now() - timedelta(seconds=60))
    ignored = running_run()
    transitions.request_cancel(ignored.id)
    Run.objects.filter(pk=ignored.id).update(cancel_requested_at=timezone.now() - timedelta(seconds=60))
    older_approval, newer_approval = run_in("waiting_for_approval"), run_in("waiting_for_approval")
    lost = run_in("failed")
    retried = run_in("failed")
    transitions.retry(retried.id)
    make_run(), run_in("completed")

    assert ids("stuck") == [stuck.id]
    assert ids("not_honoured") == [ignored.id]
    assert ids("approval") == [older_approval.id, newer_approval.id]
    assert ids("retryable") == [lost.id]
    assert set(ids("longest")) == {stuck.id, ignored.id}
    assert triage.section("stuck").action == "retire"
    with pytest.raises(KeyError):
        triage.section("nope")
