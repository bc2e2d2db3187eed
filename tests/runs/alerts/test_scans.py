"""The watchdog's alert scans: stuck, waiting too long, failure rate; each once."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import transitions, watchdog
from runs.alert_records import AlertDelivery, AlertOn
from runs.alerts import scans
from runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db


def stale(run, seconds):
    Run.objects.filter(pk=run.id).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def test_a_stuck_run_alerts_once_over_many_sweeps_for_the_rules_agent(rule, running_run):
    any_agent, mine = rule(AlertOn.STUCK, name="any"), rule(AlertOn.STUCK, name="openai-only", agent="openai")
    run, fresh = running_run(), running_run()
    stale(run, 30)
    reports = [watchdog.sweep(stuck_s=5, reap_s=600) for _ in range(3)]
    assert [r.alerts for r in reports] == [1, 0, 0]
    delivery = AlertDelivery.objects.get()
    assert (delivery.rule, delivery.run_id, delivery.dedupe_key) == (any_agent, run.id, f"stuck:{run.id}")
    assert not mine.deliveries.exists() and not AlertDelivery.objects.filter(run=fresh).exists()


def test_a_stuck_run_already_alerted_does_not_hide_a_new_one_behind_the_limit(rule, running_run):
    rule(AlertOn.STUCK)
    first, second = running_run(), running_run()
    stale(first, 60)
    assert scans.scan(stuck_after=timedelta(seconds=5), limit=1) == 1
    stale(second, 30)
    assert scans.scan(stuck_after=timedelta(seconds=5), limit=1) == 1
    assert set(AlertDelivery.objects.values_list("run_id", flat=True)) == {first.id, second.id}


def suspended_since(run, seconds):
    RunEvent.objects.filter(run=run, kind=RunEvent.Kind.SUSPENDED).update(
        at=timezone.now() - timedelta(seconds=seconds)
    )


def test_waiting_for_approval_too_long_alerts_once_per_wait(rule, released_in, running_run):
    rule(AlertOn.WAITING_TOO_LONG, name="slow-approval", threshold_s=600)
    waiting, recent = released_in(), released_in()
    on_input = running_run()
    assert transitions.suspend(on_input.id, worker="w1", status="waiting_for_input", request={"prompt": "?"})
    suspended_since(waiting, 900)
    suspended_since(recent, 60)
    suspended_since(on_input, 900)
    assert [scans.scan() for _ in range(2)] == [1, 0]
    delivery = AlertDelivery.objects.get()
    seq = RunEvent.objects.get(run=waiting, kind=RunEvent.Kind.SUSPENDED).seq
    assert (delivery.run_id, delivery.dedupe_key) == (waiting.id, f"waiting_too_long:{waiting.id}:{seq}")
    assert delivery.payload["data"]["threshold_s"] == 600 and delivery.payload["data"]["tool"] == "echo"


def end(run, status):
    reason = {"completed": "completed", "failed": "provider_failed"}[status]
    assert transitions.settle(run.id, status=status, reason=reason, worker="w1")


def test_a_failure_rate_over_the_threshold_alerts_once_per_window(rule, running_run):
    rate = rule(AlertOn.FAILURE_RATE, name="rate", failure_rate_pct=50, window_s=600)
    rule(AlertOn.FAILURE_RATE, name="rate-openai", agent="openai", failure_rate_pct=50, window_s=600)
    for status in ["failed", "failed", "completed", "completed"]:
        end(running_run(), status)
    assert scans.scan() == 0  # 4 ended runs: under the minimum of 5
    end(running_run(), "failed")  # 3 of 5 failed: 60 % > 50 %
    assert [scans.scan() for _ in range(2)] == [1, 0]
    delivery = AlertDelivery.objects.get()
    assert delivery.rule == rate and delivery.run is None
    assert delivery.payload["data"] == {"ended": 5, "failed": 3, "rate_pct": 60.0, "threshold_pct": 50,
                                        "window_s": 600}
    assert scans.scan_failure_rate(rate, now=timezone.now().timestamp() + 600) == 1  # the next window


def test_a_failure_rate_at_the_threshold_or_outside_the_window_does_not_alert(rule, running_run):
    rule(AlertOn.FAILURE_RATE, failure_rate_pct=50, window_s=600)
    runs = [running_run() for _ in range(6)]
    for run, status in zip(runs, ["failed"] * 3 + ["completed"] * 3):
        end(run, status)
    assert scans.scan() == 0  # exactly 50 %: not over
    end(running_run(), "failed")
    Run.objects.filter(pk__in=[r.id for r in runs[3:]]).update(finished_at=timezone.now() - timedelta(hours=1))
    assert scans.scan() == 0  # 4 of 4 failed in the window, but under the minimum of 5 ended
