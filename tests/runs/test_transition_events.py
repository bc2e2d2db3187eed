"""Each transition writes its event; late settles are ignored, logged and recorded."""

import logging
from decimal import Decimal

import pytest

from runs import transitions
from runs.models import Run, RunEvent, RunInput
from tests.runs.conftest import LONG_AGO


def kinds(run_id):
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))


def seqs(run_id):
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))


pytestmark = pytest.mark.django_db


def test_create_writes_created(make_run):
    run = make_run()
    assert kinds(run.id) == ["created"]
    assert run.status == "queued" and run.termination_reason == ""


def test_claim_writes_claimed_with_worker(running_run):
    run = running_run(worker="w9")
    event = RunEvent.objects.get(run=run, kind="claimed")
    assert event.actor == "w9" and run.worker == "w9" and run.heartbeat_at and run.started_at


def test_cancel_of_queued_settles_at_once_with_who_and_note(make_run):
    run = make_run()
    transitions.request_cancel(run.id, by="alice", source="cli", note="wrong prompt")
    run.refresh_from_db()
    assert (run.status, run.termination_reason) == ("cancelled", "cancelled")
    assert (run.cancel_requested_by, run.cancel_source, run.cancel_note) == ("alice", "cli", "wrong prompt")
    event = RunEvent.objects.get(run=run, kind="cancel_requested")
    assert (event.actor, event.source, event.data["note"]) == ("alice", "cli", "wrong prompt")


def test_cancel_of_live_run_records_request_once(running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="alice", note="looping")
    transitions.request_cancel(run.id, by="bob")
    run.refresh_from_db()
    assert run.status == "running" and run.cancel_requested_by == "alice"
    assert kinds(run.id).count("cancel_requested") == 1


def test_suspend_and_resume_write_events_and_queue_the_answer(running_run):
    run = running_run()
    assert transitions.suspend(run.id, worker="w1", status="waiting_for_approval", request={"tool": "rm"})
    assert Run.objects.get(pk=run.id).pending_request == {"tool": "rm"}
    assert transitions.resume(run.id, expect="waiting_for_approval", by="alice", answer={"approved": True})
    assert kinds(run.id)[-2:] == ["suspended", "resumed"]
    answer = RunInput.objects.get(run=run)
    assert (answer.kind, answer.payload, answer.created_by) == ("approval", {"approved": True}, "alice")
    assert Run.objects.get(pk=run.id).pending_request is None


def test_suspend_refused_while_cancel_pending(running_run):
    run = running_run()
    transitions.request_cancel(run.id)
    assert not transitions.suspend(run.id, worker="w1", status="waiting_for_input")


def test_settle_writes_settled_with_outcome_and_totals(running_run):
    run = running_run()
    totals = {"tokens_in": 10, "tokens_out": 20, "cost": "0.5", "steps": 2, "tool_calls": 1}
    assert transitions.settle(run.id, status="completed", reason="max_iterations", truncated=True,
                              worker="w1", totals=totals)
    run.refresh_from_db()
    assert (run.status, run.termination_reason, run.truncated) == ("completed", "max_iterations", True)
    assert (run.tokens_in, run.tokens_out, run.cost, run.steps) == (10, 20, Decimal("0.5"), 2)
    assert run.finished_at is not None
    settled = RunEvent.objects.get(run=run, kind="settled")
    assert settled.data["status"] == "completed" and settled.data["reason"] == "max_iterations"


def test_late_settle_keeps_first_outcome_logs_and_records(running_run, caplog):
    run = running_run()
    assert transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1",
                              error_class="Timeout", error_message="upstream timed out")
    first = Run.objects.get(pk=run.id)
    with caplog.at_level(logging.INFO, logger="runs.transitions"):
        assert not transitions.settle(run.id, status="completed", reason="completed", worker="w1",
                                      totals={"tokens_in": 999})
    after = Run.objects.get(pk=run.id)
    for field in ("status", "termination_reason", "tokens_in", "error_class", "error_message", "finished_at"):
        assert getattr(after, field) == getattr(first, field)
    ignored = RunEvent.objects.get(run=run, kind="late_settle_ignored")
    assert ignored.data["refused"] == {"status": "completed", "reason": "completed"}
    assert ignored.data["standing"] == {"status": "failed", "reason": "provider_failed"}
    lines = [r for r in caplog.records if "late settle ignored" in r.getMessage()]
    assert len(lines) == 1 and str(run.id) in lines[0].getMessage() and lines[0].levelno == logging.INFO


def test_settle_by_another_worker_is_refused(running_run):
    run = running_run(worker="w1")
    assert not transitions.settle(run.id, status="completed", reason="completed", worker="w2")
    assert Run.objects.get(pk=run.id).status == "running"
    assert kinds(run.id)[-1] == "late_settle_ignored"


def test_failure_after_cancel_request_is_recorded_cancelled_keeping_the_error(running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="alice")
    assert transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1",
                              error_class="ReadError", error_message="connection reset")
    run.refresh_from_db()
    assert (run.status, run.termination_reason) == ("cancelled", "cancelled")
    assert (run.error_class, run.error_message) == ("ReadError", "connection reset")


def test_completion_after_cancel_request_stands_and_notes_cancel_too_late(running_run):
    run = running_run()
    transitions.request_cancel(run.id)
    assert transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    assert Run.objects.get(pk=run.id).status == "completed"
    assert kinds(run.id)[-2:] == ["settled", "cancel_too_late"]


def test_retire_keeps_totals_and_an_earlier_request(running_run):
    run = running_run()
    assert transitions.commit_step(run.id, worker="w1", index=0, kind="message", text="hi",
                                   tokens_in=5, tokens_out=7, cost="0.01")
    transitions.request_cancel(run.id, by="alice", note="first")
    assert transitions.retire(run.id, by="bob", note="worker gone")
    run.refresh_from_db()
    assert (run.status, run.termination_reason) == ("cancelled", "cancelled")
    assert (run.tokens_in, run.tokens_out, run.steps) == (5, 7, 1)
    assert (run.cancel_requested_by, run.cancel_note) == ("alice", "first")
    retired = RunEvent.objects.get(run=run, kind="retired")
    assert (retired.actor, retired.data["note"]) == ("bob", "worker gone")


def test_escalate_cancel_writes_cancel_not_honoured(running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="alice")
    assert transitions.escalate_cancel(run.id, by="watchdog", grace_s=30)
    event = RunEvent.objects.filter(run=run).latest("seq")
    assert (event.kind, event.actor, event.source) == ("cancel_not_honoured", "watchdog", "watchdog")
    assert event.data == {"status": "running", "action": "hard stop asked", "grace_s": 30}


def test_reap_writes_reaped_and_is_retryable(running_run):
    run = running_run()
    assert transitions.reap_stale(older_than=LONG_AGO) == [run.id]
    run.refresh_from_db()
    assert (run.status, run.termination_reason, run.is_retryable) == ("failed", "worker_lost", True)
    assert kinds(run.id)[-1] == "reaped"


def test_reap_spares_a_fresh_heartbeat(running_run):
    from datetime import timedelta

    run = running_run()
    assert transitions.reap_stale(older_than=timedelta(minutes=5)) == []
    assert Run.objects.get(pk=run.id).status == "running"


def test_retry_writes_retried_on_original_and_created_on_new(run_in):
    original = run_in("failed")
    new = transitions.retry(original.id, by="alice").created
    assert kinds(original.id)[-1] == "retried"
    assert RunEvent.objects.get(run=original, kind="retried").data["new_run"] == str(new.id)
    assert RunEvent.objects.get(run=new, kind="created").data["retry_of"] == str(original.id)
    assert (new.agent, new.title, new.input) == (original.agent, original.title, original.input)


def test_event_seqs_are_gapless_per_run(running_run):
    run = running_run()
    transitions.commit_step(run.id, worker="w1", index=0, kind="message", text="a")
    transitions.request_cancel(run.id)
    transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1")
    transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    assert seqs(run.id) == list(range(1, len(seqs(run.id)) + 1))
    assert Run.objects.get(pk=run.id).event_seq == len(seqs(run.id))


@pytest.mark.parametrize("ending", [("failed", "provider_failed", "failed"), ("cancel", None, "interrupted")])
def test_queued_inputs_resolved_once_on_abnormal_end(running_run, ending):
    run = running_run()
    first = transitions.queue_input(run.id, kind="message", payload={"text": "also do X"}, by="alice").created
    second = transitions.queue_input(run.id, kind="message", payload={"text": "and Y"}, by="alice").created
    status, reason, resolution = ending
    if status == "cancel":
        transitions.retire(run.id)
        transitions.retire(run.id)
    else:
        transitions.settle(run.id, status=status, reason=reason, worker="w1")
        transitions.settle(run.id, status=status, reason=reason, worker="w1")
    for item in (first, second):
        item.refresh_from_db()
        assert (item.status, item.resolution) == ("cancelled", resolution)
    assert kinds(run.id).count("input_cancelled") == 1
    assert transitions.queue_input(run.id, kind="message", payload={}).created is None


def test_completed_run_leaves_consumed_inputs_alone(running_run):
    run = running_run()
    transitions.queue_input(run.id, kind="message", payload={"text": "x"})
    assert [i.payload for i in transitions.consume_inputs(run.id)] == [{"text": "x"}]
    assert transitions.consume_inputs(run.id) == []
    transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    assert RunInput.objects.get(run=run).status == "consumed"


def test_commit_step_refused_after_cancel_request(running_run):
    run = running_run()
    assert transitions.commit_step(run.id, worker="w1", index=0, kind="message", text="a")
    transitions.request_cancel(run.id)
    assert transitions.commit_step(run.id, worker="w1", index=1, kind="message", text="b") is None
    assert Run.objects.get(pk=run.id).steps == 1


def test_commit_step_requires_next_index_and_holder_and_results(running_run):
    run = running_run()
    assert transitions.commit_step(run.id, worker="w1", index=1, kind="message") is None  # gap
    assert transitions.commit_step(run.id, worker="w2", index=0, kind="message") is None  # not holder
    with pytest.raises(ValueError):
        transitions.commit_step(run.id, worker="w1", index=0, kind="tool_calls",
                                tool_calls=[{"id": "1", "name": "sleep", "args": {}}])
    step = transitions.commit_step(run.id, worker="w1", index=0, kind="tool_calls",
                                   tool_calls=[{"id": "1", "name": "sleep", "args": {}, "result": "ok"}])
    assert step.index == 0
    assert Run.objects.get(pk=run.id).tool_calls == 1
    assert kinds(run.id)[-1] == "step_committed"


def test_claim_next_takes_oldest_of_the_named_agents(make_run):
    other = make_run(agent="other")
    first = make_run(agent="scripted")
    make_run(agent="scripted")
    claimed = transitions.claim_next(worker="w1", agents=["scripted"])
    assert claimed.id == first.id and claimed.status == "running"
    assert transitions.claim_next(worker="w1", agents=["nobody"]) is None
    assert Run.objects.get(pk=other.id).status == "queued"


def test_impossible_outcomes_are_programming_errors(running_run):
    run = running_run()
    with pytest.raises(ValueError):
        transitions.settle(run.id, status="completed", reason="worker_lost")
    with pytest.raises(ValueError):
        transitions.settle(run.id, status="completed", reason="completed", truncated=True)
    with pytest.raises(ValueError):
        transitions.request_cancel(run.id, source="martians")
    assert Run.objects.get(pk=run.id).status == "running"


def test_create_run_rejects_bad_limits(db):
    for bad in ({"agent": ""}, {"agent": "a", "max_iterations": 0}, {"agent": "a", "token_budget": -1},
                {"agent": "a", "cost_budget": "abc"}, {"agent": "a", "cost_budget": "NaN"}):
        with pytest.raises(ValueError):
            transitions.create_run(**bad)
    assert not Run.objects.exists()


def test_error_message_is_made_safe(running_run):
    run = running_run()
    transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1",
                       error_message="bad\x00\x1b[31m" + "x" * 5000)
    message = Run.objects.get(pk=run.id).error_message
    assert "\x00" not in message and "\x1b" not in message and len(message) == 2000


def test_a_released_suspend_writes_suspended_and_charges_the_gated_reply(released_in):
    run = released_in()
    event = RunEvent.objects.filter(run=run, kind="suspended").get()
    assert event.actor == "w1" and event.data["released"] is True
    assert event.data["charged"] == {"tokens_in": "3", "tokens_out": "4", "cost": "0.01"}
    assert "resume" not in event.data["request"] and event.data["request"]["tool"] == "echo"
    assert (run.tokens_in, run.tokens_out, run.cost) == (3, 4, Decimal("0.01"))
    assert run.shown_request == {"kind": "approval", "call_id": "c0", "tool": "echo"}


def test_resume_of_a_released_wait_queues_it_with_the_answer_and_keeps_what_it_needs(released_in):
    run = released_in()
    assert transitions.resume(run.id, expect="waiting_for_approval", by="alice", answer={"approved": True})
    after = Run.objects.get(pk=run.id)
    assert (after.status, after.worker, after.wait_deadline) == ("queued", "", None)
    assert after.pending_request["resume"]["step"]["index"] == 0  # for the worker that resumes it
    event = RunEvent.objects.filter(run=run, kind="resumed").get()
    assert (event.actor, event.data["requeued"], event.data["answer"]) == ("alice", True, {"approved": True})
    answer = RunInput.objects.get(run=run)
    assert (answer.kind, answer.status, answer.created_by) == ("approval", "queued", "alice")
    assert not transitions.resume(run.id, expect="waiting_for_approval", by="bob", answer={"approved": False})  # answered once


def test_claim_of_an_answered_run_writes_claimed_resumed_and_keeps_its_start(released_in):
    run = released_in()
    assert transitions.resume(run.id, expect="waiting_for_approval", by="alice", answer={"approved": True})
    claimed = transitions.claim_next(worker="w2")
    assert claimed.id == run.id and claimed.worker == "w2" and claimed.started_at == run.started_at
    event = RunEvent.objects.filter(run=run, kind="claimed").order_by("seq").last()
    assert (event.actor, event.data) == ("w2", {"status": "running", "resumed": True})


def test_claim_next_takes_answered_runs_first_then_the_oldest_fresh_one(make_run, released_in):
    fresh = make_run(title="fresh, oldest")
    answered, unanswered = released_in(), released_in()
    assert transitions.resume(answered.id, expect="waiting_for_approval", by="op", answer={"approved": True})
    other_agent = released_in(agent="billing-bot")
    assert transitions.resume(other_agent.id, expect="waiting_for_approval", by="op", answer={"approved": True})
    assert transitions.claim_next(worker="w2", agents=["scripted"]).id == answered.id
    assert transitions.claim_next(worker="w2", agents=["scripted"]).id == fresh.id
    assert transitions.claim_next(worker="w2", agents=["scripted"]) is None  # a wait is never claimed
    assert Run.objects.get(pk=unanswered.id).status == "waiting_for_approval"
    assert transitions.claim_next(worker="w3", agents=["billing-bot"]).id == other_agent.id


def test_expiry_writes_settled_by_the_watchdog_and_the_discarded_gated_step(released_in):
    run = released_in(timeout_s=-1)
    assert transitions.expire_waits() == [run.id]
    after = Run.objects.get(pk=run.id)
    assert (after.status, after.termination_reason, after.error_class) == ("failed", "approval_denied", "ApprovalTimeout")
    settled = RunEvent.objects.get(run=run, kind="settled")
    assert (settled.actor, settled.source, settled.data["expired"]) == ("watchdog", "watchdog", "waiting_for_approval")
    discarded = RunEvent.objects.get(run=run, kind="step_discarded")
    assert (discarded.data["index"], discarded.data["reason"], discarded.data["tokens_out"]) == (0, "expired", 4)
    assert (after.tokens_out, after.cost) == (4, Decimal("0.01"))  # charged once, at park
    assert transitions.expire_waits() == []  # once


def test_expiry_resolves_queued_inputs_once(released_in):
    run = released_in(timeout_s=-1)
    item = transitions.queue_input(run.id, kind="message", payload={"text": "hi"}, by="op").created
    assert transitions.expire_waits() == [run.id]
    item.refresh_from_db()
    assert (item.status, item.resolution) == ("cancelled", "failed")
    assert kinds(run.id).count("input_cancelled") == 1
