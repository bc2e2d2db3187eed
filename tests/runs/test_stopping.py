"""A guardrail's stop: requested like a cancel, ended as the stop says, never cancelled."""

from decimal import Decimal

import pytest

from runs import messages, transitions
from runs.models import Run, RunEvent
from runs.transitions import SettleOutcome, StopOutcome
from tests.runs.test_races import by_run, race

pytestmark = pytest.mark.django_db
BUDGET, POLICY = Run.TerminationReason.BUDGET_EXHAUSTED, Run.TerminationReason.POLICY_DENIED


def stop(run, reason=BUDGET, limit="tokens", **kwargs):
    return transitions.request_stop(run.id, reason=reason, limit=limit, **kwargs)


def ending(run):
    run.refresh_from_db()
    return run.status, run.termination_reason, run.truncated


def test_stop_of_a_held_run_is_requested_with_its_event_and_reason(running_run):
    run = running_run()
    assert stop(run, note="token budget 100 reached (120 spent)", evidence={"spent": "120"}) == StopOutcome.REQUESTED
    run.refresh_from_db()
    assert run.status == "running" and run.cancel_requested_at and run.stop_reason == BUDGET
    assert (run.cancel_requested_by, run.cancel_source) == ("guardrail", "guardrail")
    event = RunEvent.objects.get(run=run, kind="stop_requested")
    assert event.data == {"status": "running", "reason": BUDGET, "limit": "tokens",
                          "note": "token budget 100 reached (120 spent)", "spent": "120"}


def test_a_second_stop_and_an_abort_after_it_change_nothing(running_run):
    run = running_run()
    assert stop(run) == StopOutcome.REQUESTED
    assert stop(run, reason=POLICY, limit="loop") == StopOutcome.ALREADY_STOPPING
    assert transitions.request_cancel(run.id, by="alice") == transitions.CancelOutcome.ALREADY_REQUESTED
    run.refresh_from_db()
    assert run.stop_reason == BUDGET and run.cancel_requested_by == "guardrail"


def test_an_abort_pending_keeps_its_ending_over_a_later_stop(running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="alice")
    assert stop(run) == StopOutcome.ALREADY_STOPPING
    assert transitions.settle(run.id, status="cancelled", reason="cancelled", worker="w1") == SettleOutcome.SETTLED
    assert ending(run) == ("cancelled", "cancelled", False)


@pytest.mark.parametrize("reason, expected", [
    (BUDGET, ("completed", "budget_exhausted", True)),
    (POLICY, ("failed", "policy_denied", False)),
])
def test_a_stop_honoured_as_a_cancel_ends_as_the_stop_says(running_run, reason, expected):
    run = running_run()
    stop(run, reason=reason)
    # The engine stops at a checkpoint as for a cancel, and settles cancelled: the row says why.
    assert transitions.settle(run.id, status="cancelled", reason="cancelled", worker="w1") == SettleOutcome.STOPPED
    assert ending(run) == expected
    settled = RunEvent.objects.get(run=run, kind="settled")
    assert settled.data["reason"] == reason and settled.data["truncated"] is expected[2]


def test_a_failure_while_a_stop_is_pending_is_recorded_as_the_stop(running_run):
    run = running_run()
    stop(run)
    outcome = transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1")
    assert outcome == SettleOutcome.STOPPED
    assert ending(run) == ("completed", "budget_exhausted", True)


def test_an_agent_settling_as_the_stop_asks_is_settled_with_no_too_late_trace(running_run):
    run = running_run()
    stop(run)
    outcome = transitions.settle(run.id, status="completed", reason="budget_exhausted", truncated=True, worker="w1")
    assert outcome == SettleOutcome.SETTLED
    assert ending(run) == ("completed", "budget_exhausted", True)
    assert not RunEvent.objects.filter(run=run, kind="cancel_too_late").exists()


def test_completing_normally_past_a_stop_is_traced_as_too_late(running_run):
    run = running_run()
    stop(run)
    assert transitions.settle(run.id, status="completed", reason="completed", worker="w1") == SettleOutcome.SETTLED
    assert ending(run) == ("completed", "completed", False)
    assert RunEvent.objects.filter(run=run, kind="cancel_too_late").exists()


@pytest.mark.parametrize("reason, expected", [
    (BUDGET, ("completed", "budget_exhausted", True)),
    (POLICY, ("failed", "policy_denied", False)),
])
def test_a_queued_run_stops_at_once(make_run, reason, expected):
    run = make_run()
    assert stop(run, reason=reason) == StopOutcome.SETTLED
    assert ending(run) == expected
    assert RunEvent.objects.get(run=run, kind="stop_requested").data["settled_queued"] is True


def test_a_released_wait_stops_at_once(released_in):
    run = released_in()
    assert stop(run) == StopOutcome.SETTLED
    assert ending(run) == ("completed", "budget_exhausted", True)


def test_an_ignored_stop_is_escalated_then_retired_with_the_stops_ending(running_run):
    run = running_run()
    stop(run)
    assert transitions.escalate_cancel(run.id) == transitions.EscalateOutcome.ESCALATED
    assert transitions.retire(run.id, by="watchdog", source="watchdog") == transitions.RetireOutcome.RETIRED
    assert ending(run) == ("completed", "budget_exhausted", True)
    assert transitions.settle(run.id, status="cancelled", reason="cancelled", worker="w1") == SettleOutcome.ALREADY_TERMINAL


def test_a_retire_with_no_stop_still_cancels(running_run):
    run = running_run()
    transitions.retire(run.id, by="bob")
    assert ending(run) == ("cancelled", "cancelled", False)


def test_reap_of_a_stopping_run_keeps_the_stops_ending(running_run):
    from datetime import timedelta

    run = running_run()
    stop(run, reason=POLICY, limit="loop")
    Run.objects.filter(pk=run.pk).update(heartbeat_at=run.heartbeat_at - timedelta(hours=1))
    assert transitions.reap_stale(older_than=timedelta(minutes=5)) == [run.id]
    assert ending(run) == ("failed", "policy_denied", False)


def test_the_worker_message_names_the_stop(running_run):
    run = running_run()
    stop(run)
    run.refresh_from_db()
    assert messages.cancel(run)["stop"] == BUDGET
    assert "stop" not in messages.cancel(running_run())


def test_the_heartbeat_answers_a_pending_stop(running_run):
    run = running_run()
    stop(run)
    assert transitions.heartbeat(run.id, worker="w1").cancel_requested


def test_bad_reason_and_unknown_run(running_run):
    with pytest.raises(ValueError):
        stop(running_run(), reason="cancelled")
    assert transitions.request_stop("nope", reason=BUDGET, limit="tokens") == StopOutcome.NOT_FOUND
    run = running_run()
    transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    assert stop(run) == StopOutcome.ALREADY_TERMINAL


# Per-run budgets, enforced on what the server sees.

def commit(run, index=0, **spend):
    return transitions.commit_step(run.id, worker="w1", index=index, kind="message", text="hi", **spend)


def test_a_commit_under_budget_asks_nothing(running_run):
    run = running_run(token_budget=100)
    step = commit(run, tokens_in=10, tokens_out=20)
    assert step.stopping is None
    assert not RunEvent.objects.filter(run=run, kind="stop_requested").exists()


def test_a_commit_reaching_the_token_budget_asks_the_run_to_stop(running_run):
    run = running_run(token_budget=100)
    step = commit(run, tokens_in=60, tokens_out=40)
    assert step.stopping == StopOutcome.REQUESTED
    event = RunEvent.objects.get(run=run, kind="stop_requested")
    assert event.data["limit"] == "tokens" and event.data["note"] == "token budget 100 reached (100 spent)"
    assert commit(run, index=1) is None  # nothing more is committed: the in-flight step is discarded


def test_the_cost_and_tool_call_budgets_are_enforced(running_run):
    run = running_run(cost_budget=Decimal("0.05"))
    assert commit(run, cost="0.06").stopping == StopOutcome.REQUESTED
    assert RunEvent.objects.get(run=run, kind="stop_requested").data["limit"] == "cost"
    run = running_run(tool_call_budget=2)
    calls = [{"id": f"c{i}", "name": "echo", "args": {}, "result": "ok"} for i in range(2)]
    step = transitions.commit_step(run.id, worker="w1", index=0, kind="tool_calls", tool_calls=calls)
    assert step.stopping == StopOutcome.REQUESTED
    assert RunEvent.objects.get(run=run, kind="stop_requested").data["limit"] == "tool_calls"


def test_discarded_spend_counts_against_the_budget(running_run):
    run = running_run(token_budget=50)
    assert transitions.record_discard(run.id, worker="w1", index=0, text="partial", tokens_out=80)
    run.refresh_from_db()
    assert run.stop_reason == BUDGET


def test_racing_stops_give_one_request(postgres):
    from tests.conftest import claim_new_run

    runs = [claim_new_run(title=f"r{i}") for i in range(20)]
    results = race([lambda run: stop(run)] * 4, runs)
    for answers in by_run(results).values():
        assert sorted(answers.values(), key=str).count(StopOutcome.REQUESTED) == 1
    assert RunEvent.objects.filter(kind="stop_requested").count() == len(runs)
