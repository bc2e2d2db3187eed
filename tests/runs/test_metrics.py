"""Metric values after a known sequence of actions."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import metrics, transitions
from runs.models import Run
from tests.runs.conftest import LONG_AGO

pytestmark = pytest.mark.django_db


def scrape():
    text = metrics.render().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_a_cancel_of_a_released_wait_counts_with_the_queued_ones(released_in, running_run):
    # Settled by the request itself (nobody held the run): 0 ms, not a worker's latency.
    transitions.request_cancel(released_in().id)
    values = scrape()
    assert values['runwarden_cancel_latency_seconds_count{kind="queued"}'] == 1
    assert values['runwarden_cancel_latency_seconds_count{kind="live"}'] == 0


def test_values_after_a_known_sequence(make_run, running_run, run_in):
    make_run()  # queued
    running_run()  # running
    run_in("completed")
    late = run_in("failed")
    transitions.settle(late.id, status="completed", reason="completed", worker="w1")  # late: ignored
    cancelled_queued = make_run()
    transitions.request_cancel(cancelled_queued.id)  # cancelled at once
    slow = running_run()
    transitions.request_cancel(slow.id)
    Run.objects.filter(pk=slow.id).update(cancel_requested_at=timezone.now() - timedelta(seconds=3))
    transitions.settle(slow.id, status="cancelled", reason="cancelled", worker="w1")
    retired = running_run()
    transitions.retire(retired.id)  # settled by the retire itself: not a worker's latency
    lost = running_run()
    Run.objects.filter(pk=lost.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))

    values = scrape()
    assert values['runwarden_runs{reason="",status="queued"}'] == 1
    assert values['runwarden_runs{reason="",status="running"}'] == 2
    assert values['runwarden_runs{reason="completed",status="completed"}'] == 1
    assert values['runwarden_runs{reason="provider_failed",status="failed"}'] == 1
    assert values['runwarden_runs{reason="cancelled",status="cancelled"}'] == 3
    assert values["runwarden_active_runs"] == 2
    assert values["runwarden_stuck_runs"] == 1
    assert values["runwarden_late_settles_ignored_total"] == 1
    assert values["runwarden_reaped_runs_total"] == 0
    # Live runs only: the queued cancel and the retire (0 ms each) are series of their own.
    live = 'runwarden_cancel_latency_seconds_{}{{kind="live"{}}}'
    assert values[live.format("bucket", ',le="1.0"')] == 0
    assert values[live.format("bucket", ',le="5.0"')] == 1
    assert values[live.format("bucket", ',le="+Inf"')] == 1
    assert values[live.format("count", "")] == 1
    assert 2.9 < values[live.format("sum", "")] < 4
    for kind in ("queued", "retired"):
        assert values[f'runwarden_cancel_latency_seconds_bucket{{kind="{kind}",le="0.005"}}'] == 1
        assert values[f'runwarden_cancel_latency_seconds_count{{kind="{kind}"}}'] == 1

    transitions.reap_stale(older_than=LONG_AGO)
    values = scrape()
    assert values["runwarden_reaped_runs_total"] == 2
    assert values["runwarden_active_runs"] == 0


def test_open_websockets_gauge_is_exported():
    metrics.OPEN_WEBSOCKETS.labels(kind="viewer").inc()
    try:
        assert re.search(r'runwarden_open_websockets\{kind="viewer"\} 1\.0', metrics.render().decode())
    finally:
        metrics.OPEN_WEBSOCKETS.labels(kind="viewer").dec()


def test_cancels_not_honoured_are_counted(running_run):
    assert scrape()["runwarden_cancels_not_honoured_total"] == 0
    ignored = running_run()
    transitions.request_cancel(ignored.id)
    assert transitions.escalate_cancel(ignored.id)
    assert scrape()["runwarden_cancels_not_honoured_total"] == 1


def test_alert_deliveries_are_counted_by_status_from_the_rows():
    from runs.alert_records import AlertDelivery, AlertRule
    from runs.alerts import outbox

    rule = AlertRule.objects.create(name="r", on="reaped", url="http://127.0.0.1:9/h", secret="s")
    for key in "abcdef":
        outbox.enqueue([rule], on="reaped", run=None, key=key, data={})
    AlertDelivery.objects.filter(dedupe_key__in="abc").update(status="sent")
    AlertDelivery.objects.filter(dedupe_key="d").update(status="failed")
    values = scrape()
    assert [values[f'runwarden_alerts{{status="{s}"}}'] for s in ("sent", "pending", "failed")] == [3, 2, 1]
