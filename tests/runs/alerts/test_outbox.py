"""The outbox: an alert row written with its event, in the event's transaction."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import events, transitions
from runs.alert_records import AlertDelivery, AlertOn
from runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db
E = RunEvent.Kind


def stale(run, seconds=600):
    Run.objects.filter(pk=run.id).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def keys(on=None):
    rows = AlertDelivery.objects.all() if on is None else AlertDelivery.objects.filter(event=on)
    return sorted((d.rule.name, d.dedupe_key) for d in rows.select_related("rule"))


def test_a_reaped_run_queues_one_delivery_per_matching_rule(rule, running_run):
    rule(AlertOn.REAPED, name="any")
    rule(AlertOn.REAPED, name="mine", agent="scripted")
    rule(AlertOn.REAPED, name="theirs", agent="openai")
    rule(AlertOn.REAPED, name="off", enabled=False)
    rule(AlertOn.STUCK, name="other-event")
    run = running_run()
    stale(run)
    assert transitions.reap_stale(older_than=timedelta(seconds=60)) == [run.id]
    assert keys() == [("any", f"reaped:{run.id}"), ("mine", f"reaped:{run.id}")]
    delivery = AlertDelivery.objects.get(rule__name="any")
    assert (delivery.run_id, delivery.status, delivery.attempts) == (run.id, "pending", 0)
    assert delivery.payload["run"] == {"id": str(run.id), "title": "a run", "status": "failed", "reason": "worker_lost"}
    assert delivery.payload["agent"] == "scripted"


class Boom(Exception):
    pass


def test_a_rolled_back_transition_writes_no_delivery(rule, running_run):
    rule(AlertOn.REAPED)
    run = running_run()
    stale(run)
    with pytest.raises(Boom), transaction.atomic():
        assert transitions.reap_stale(older_than=timedelta(seconds=60)) == [run.id]
        assert AlertDelivery.objects.count() == 1  # written inside the change's transaction…
        raise Boom
    assert AlertDelivery.objects.count() == 0  # …and gone with it
    assert Run.objects.get(pk=run.id).status == "running"


def test_a_rolled_back_event_writes_no_delivery(rule, running_run):
    rule(AlertOn.LOOP_FLAGGED)
    run = running_run()
    with pytest.raises(Boom), transaction.atomic():
        events.append(run.id, E.FLAGGED, flag="repeated_tool", evidence={"tool": "echo", "times": 3})
        raise Boom
    assert AlertDelivery.objects.count() == 0


def test_events_that_do_not_alert_never_read_the_rules(rule, running_run):
    rule(AlertOn.REAPED)
    rule(AlertOn.LOOP_FLAGGED)
    run = running_run()
    with CaptureQueriesContext(connection) as queries:
        assert transitions.commit_step(run.id, worker="w1", index=0, kind="message", text="hi")
        assert transitions.request_cancel(run.id) == transitions.CancelOutcome.REQUESTED
        assert transitions.settle(run.id, status="cancelled", reason="cancelled", worker="w1")
    sql = [q["sql"] for q in queries.captured_queries]
    assert sql and not [s for s in sql if "alert" in s.lower()]
    with CaptureQueriesContext(connection) as queries:  # the probe can see a rules query when there is one
        events.append(run.id, E.FLAGGED, flag="repeated_tool", evidence={})
    assert [q for q in queries.captured_queries if "runs_alertrule" in q["sql"]]


def test_an_unhonoured_cancel_alerts_once(rule, running_run):
    rule(AlertOn.CANCEL_NOT_HONOURED, name="nh")
    run = running_run()
    assert transitions.request_cancel(run.id) == transitions.CancelOutcome.REQUESTED
    assert transitions.escalate_cancel(run.id) == transitions.EscalateOutcome.ESCALATED
    assert transitions.escalate_cancel(run.id) == transitions.EscalateOutcome.ALREADY_ESCALATED
    assert keys() == [("nh", f"cancel_not_honoured:{run.id}")]


def test_a_budget_stop_alerts_and_a_policy_stop_does_not(rule, running_run):
    rule(AlertOn.BUDGET_REACHED, name="budget")
    run, other = running_run(), running_run()
    events.append(run.id, E.STOP_REQUESTED, reason="budget_exhausted", limit="tokens", used=120, budget=100)
    events.append(run.id, E.STOP_REQUESTED, reason="budget_exhausted", limit="tokens", used=130, budget=100)
    events.append(other.id, E.STOP_REQUESTED, reason="policy_denied", limit="loop")
    assert keys() == [("budget", f"budget_reached:{run.id}:tokens")]  # once per run and limit
    assert AlertDelivery.objects.get().payload["data"] == {
        "reason": "budget_exhausted", "limit": "tokens", "used": 120, "budget": 100
    }


def test_a_loop_flag_alerts_once_per_flag_for_the_rules_agent(rule, running_run):
    rule(AlertOn.LOOP_FLAGGED, name="loops", agent="scripted")
    run, elsewhere = running_run(), running_run(agent="openai")
    for _ in range(2):
        events.append(run.id, E.FLAGGED, flag="repeated_tool", evidence={"tool": "echo", "times": 3})
    events.append(run.id, E.FLAGGED, flag="failing_tools", evidence={"failed": 3})
    events.append(elsewhere.id, E.FLAGGED, flag="repeated_tool", evidence={})
    assert keys() == [("loops", f"loop_flagged:{run.id}:failing_tools"), ("loops", f"loop_flagged:{run.id}:repeated_tool")]
