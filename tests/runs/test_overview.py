"""The overview's numbers for a known day."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import overview, transitions
from runs.models import Run

pytestmark = pytest.mark.django_db


def test_last_24h_counts_by_hour_status_reason_and_latency(make_run, run_in):
    run_in("completed"), run_in("failed"), run_in("failed")
    old = make_run()
    Run.objects.filter(pk=old.id).update(created_at=timezone.now() - timedelta(days=2))  # outside
    quick = make_run()
    transitions.request_cancel(quick.id)  # settled at once: 0 ms, not a worker's latency
    stopped = make_run()
    assert transitions.claim(stopped.id, worker="w1")
    transitions.request_cancel(stopped.id)
    Run.objects.filter(pk=stopped.id).update(cancel_requested_at=timezone.now() - timedelta(milliseconds=40))
    assert transitions.settle(stopped.id, status="cancelled", reason="cancelled", worker="w1")
    numbers = overview.last_24h()
    assert len(numbers.hours) == 24
    assert sum(sum(by_status.values()) for _, by_status in numbers.hours) == 5
    assert dict(numbers.statuses)["failed"] == 2 and dict(numbers.statuses)["queued"] == 0
    assert dict(numbers.reasons) == {"completed": 1, "provider_failed": 2, "cancelled": 2}
    assert numbers.latency_count == 1 and dict(numbers.latency)["≤50 ms"] == 1
    assert numbers.settled_at_once == {"queued": 1, "retired": 0}


def test_windows_bucket_status_and_reasons_over_time(run_in):
    now = timezone.now()
    recent, older = run_in("failed"), run_in("completed")
    Run.objects.filter(pk=older.id).update(created_at=now - timedelta(days=3))
    week = overview.for_window("7d", now)
    assert len(week.buckets) == 28 and week.window.bucket == timedelta(hours=6)
    by_reason = {start: reasons for start, _, reasons in week.buckets if reasons}
    assert sorted(r for reasons in by_reason.values() for r in reasons) == ["completed", "provider_failed"]
    assert len(by_reason) == 2  # in two different buckets: reasons over time, not only totals
    hour = overview.for_window("1h", now)
    assert len(hour.buckets) == 12 and dict(hour.reasons) == {"provider_failed": 1}
    assert sum(hour.buckets[-1][1].values()) == 1 and recent
