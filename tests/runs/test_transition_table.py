"""The full transition table: every verb from every state, with the outcome it answers.

The expectations are written out here, by hand, and checked twice: against what the
verb does to a real row (a refused verb changes nothing: the row is compared field by
field), and against the declared lifecycle (`runs.transitions.table`): a verb that
wins must start from a status the table allows and leave the run where it says.
"""

from datetime import timedelta

import pytest
from django.forms.models import model_to_dict
from django.utils import timezone

from runs import transitions
from runs.models import Run
from runs.transitions import (
    LIFECYCLE, CancelOutcome, ClaimOutcome, EscalateOutcome, InputOutcome, Kind, ResumeOutcome, RetireOutcome,
    RetryOutcome, SettleOutcome, StopOutcome, SuspendOutcome,
)
from runs.transitions.table import ALLOWED_FROM
from tests.runs.conftest import LONG_AGO, STATUSES

WAITING = ("waiting_for_input", "waiting_for_approval")
LIVE = ("running", *WAITING)
TERMINAL = ("completed", "failed", "cancelled")
RELEASED = ("released_input", "released_approval")  # waits the engine let go of (no holder)
STATES = (*STATUSES, *RELEASED)
STATUS_OF = {"released_input": "waiting_for_input", "released_approval": "waiting_for_approval"}
SAME = None  # the status does not change

C, Cl, Rs, Rt, Se, Su, Es, Ry, In = (CancelOutcome, ClaimOutcome, ResumeOutcome, RetireOutcome, SettleOutcome,
                                     SuspendOutcome, EscalateOutcome, RetryOutcome, InputOutcome)


def each(live=None, *, queued=None, held=None, released=None, terminal=None, **states):
    """{state: (outcome, status after)} from groups, overridden per state."""
    table = {"queued": queued or live}
    for state in LIVE:
        table[state] = held or live
    for state in RELEASED:
        table[state] = released or held or live
    for state in TERMINAL:
        table[state] = terminal
    table.update(states)
    return table


ENDED = lambda outcomes: (outcomes.ALREADY_TERMINAL, SAME)  # noqa: E731

# verb -> state -> (outcome, status after; SAME when unchanged)
EXPECTED = {
    "claim": each((Cl.NOT_QUEUED, SAME), queued=(Cl.CLAIMED, "running"), terminal=ENDED(Cl)),
    "request_cancel": each(
        (C.REQUESTED, SAME), queued=(C.SETTLED, "cancelled"), released=(C.SETTLED, "cancelled"), terminal=ENDED(C),
    ),
    "suspend": each((Su.NOT_HELD, SAME), running=(Su.SUSPENDED, "waiting_for_approval"), terminal=ENDED(Su)),
    "answer_approval": each(
        (Rs.NOT_WAITING, SAME), terminal=ENDED(Rs),
        waiting_for_approval=(Rs.RESUMED, "running"), released_approval=(Rs.REQUEUED, "queued"),
        waiting_for_input=(Rs.WAITS_FOR_INPUT, SAME), released_input=(Rs.WAITS_FOR_INPUT, SAME),
    ),
    "answer_input": each(
        (Rs.NOT_WAITING, SAME), terminal=ENDED(Rs),
        waiting_for_input=(Rs.RESUMED, "running"), released_input=(Rs.REQUEUED, "queued"),
        waiting_for_approval=(Rs.WAITS_FOR_APPROVAL, SAME), released_approval=(Rs.WAITS_FOR_APPROVAL, SAME),
    ),
    "settle": each(
        (Se.SETTLED, "completed"), queued=(Se.NOT_HELD, SAME), released=(Se.NOT_HELD, SAME), terminal=ENDED(Se),
    ),
    "retire": each((Rt.RETIRED, "cancelled"), terminal=ENDED(Rt)),
    "request_stop": each(
        (StopOutcome.REQUESTED, SAME), queued=(StopOutcome.SETTLED, "completed"),
        released=(StopOutcome.SETTLED, "completed"), terminal=ENDED(StopOutcome),
    ),
    "escalate_cancel": each((Es.NO_CANCEL_PENDING, SAME), terminal=ENDED(Es)),
    "queue_input": each((In.QUEUED, SAME), terminal=ENDED(In)),
    "retry": each(
        (Ry.NOT_ENDED, SAME), completed=(Ry.NOT_RETRYABLE, SAME), cancelled=(Ry.NOT_RETRYABLE, SAME),
        failed=(Ry.RETRIED, SAME),  # failed / provider_failed: retryable; the row itself never changes
    ),
}
VERB_OF = {"answer_approval": "resume", "answer_input": "resume"}


def attempt(name, run_id):
    if name == "claim":
        return transitions.claim(run_id, worker="w2")
    if name == "request_cancel":
        return transitions.request_cancel(run_id, by="op")
    if name == "request_stop":
        return transitions.request_stop(run_id, reason="budget_exhausted", limit="tokens")
    if name == "suspend":
        return transitions.suspend(run_id, worker="w1", status="waiting_for_approval")
    if name == "answer_approval":
        return transitions.resume(run_id, expect="waiting_for_approval", by="op", answer={"approved": True})
    if name == "answer_input":
        return transitions.resume(run_id, expect="waiting_for_input", by="op", answer={"text": "go on"})
    if name == "settle":
        return transitions.settle(run_id, status="completed", reason="completed", worker="w1")
    if name == "retire":
        return transitions.retire(run_id, by="op")
    if name == "escalate_cancel":
        return transitions.escalate_cancel(run_id)
    if name == "queue_input":
        return transitions.queue_input(run_id, kind="message", payload={"text": "hi"}, by="op").outcome
    if name == "retry":
        return transitions.retry(run_id, by="op").outcome
    raise AssertionError(name)


@pytest.fixture
def state_in(run_in, released_in):
    def make(state):
        return released_in(STATUS_OF[state]) if state in RELEASED else run_in(state)

    return make


def snapshot(run_id):
    row = model_to_dict(Run.objects.get(pk=run_id))
    row.pop("event_seq")  # a refused settle appends `late_settle_ignored`: only the seq moves
    return row


def declared_targets(verb, status):
    """Where the lifecycle table says `verb` may take a run in `status`."""
    edges = [edge for edge in LIFECYCLE if edge.verb == verb and status in edge.sources]
    return {target for edge in edges for target in (edge.targets or (status,))}


def test_every_verb_and_state_has_an_expectation():
    assert all(set(row) == set(STATES) for row in EXPECTED.values())
    declared = {edge.verb for edge in LIFECYCLE} - {"create_run", "heartbeat", "reap", "expire_wait"}
    assert {VERB_OF.get(name, name) for name in EXPECTED} == declared  # the others: tests below


@pytest.mark.django_db
@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_transition_table(state_in, state, name):
    outcome, then = EXPECTED[name][state]
    run = state_in(state)
    before = snapshot(run.id)
    answered = attempt(name, run.id)
    assert answered is outcome
    after = Run.objects.get(pk=run.id)
    verb = VERB_OF.get(name, name)
    if outcome.kind is Kind.DONE:
        assert run.status in ALLOWED_FROM[verb]
        assert after.status == (then or run.status)
        assert after.status in declared_targets(verb, run.status)
    else:
        assert snapshot(run.id) == before
        if run.status not in ALLOWED_FROM[verb]:
            assert outcome.kind is not Kind.DONE  # (the guard cannot win where the table forbids)


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("bad", ["not-a-uuid", "00000000-0000-0000-0000-000000000000", "", None])
def test_unknown_and_malformed_ids_are_not_found(db, name, bad):
    assert attempt(name, bad).kind is Kind.NOT_FOUND


@pytest.mark.django_db
@pytest.mark.parametrize("state", STATES)
def test_reap_from_every_state(state_in, state):
    run = state_in(state)
    before = snapshot(run.id)
    reaped = transitions.reap_stale(older_than=LONG_AGO)
    if state == "running":  # only a held running run has a heartbeat to go stale
        assert reaped == [run.id]
        after = Run.objects.get(pk=run.id)
        assert after.status in declared_targets("reap", "running")
        assert (after.status, after.termination_reason) == ("failed", "worker_lost")
    else:
        assert reaped == [] and snapshot(run.id) == before


@pytest.mark.django_db
@pytest.mark.parametrize("state", LIVE)
def test_escalate_cancel_once_a_cancel_is_pending(state_in, state):
    run = state_in(state)
    assert transitions.request_cancel(run.id, by="op") is CancelOutcome.REQUESTED
    assert transitions.escalate_cancel(run.id) is EscalateOutcome.ESCALATED
    after = Run.objects.get(pk=run.id)
    assert after.status == state and after.cancel_escalated_at is not None
    assert transitions.escalate_cancel(run.id) is EscalateOutcome.ALREADY_ESCALATED  # once


@pytest.mark.django_db
@pytest.mark.parametrize("state", LIVE)
def test_a_second_cancel_is_already_requested(state_in, state):
    run = state_in(state)
    assert transitions.request_cancel(run.id, by="op") is CancelOutcome.REQUESTED
    assert Run.objects.get(pk=run.id).is_cancelling
    assert transitions.request_cancel(run.id, by="op") is CancelOutcome.ALREADY_REQUESTED


@pytest.mark.django_db
def test_suspend_with_a_cancel_pending_says_so(state_in):
    run = state_in("running")
    transitions.request_cancel(run.id, by="op")
    assert transitions.suspend(run.id, worker="w1", status="waiting_for_input") is SuspendOutcome.CANCEL_PENDING
    assert transitions.suspend(run.id, worker="w2", status="waiting_for_input") is SuspendOutcome.NOT_HELD


@pytest.mark.django_db
def test_settle_by_another_worker_is_not_held_and_traced(state_in):
    run = state_in("running")
    assert transitions.settle(run.id, status="completed", reason="completed", worker="w2") is SettleOutcome.NOT_HELD
    assert run.events.filter(kind="late_settle_ignored").count() == 1
    assert Run.objects.get(pk=run.id).status == "running"


@pytest.mark.django_db
def test_a_failure_while_a_cancel_is_pending_answers_cancel_won(state_in):
    run = state_in("running")
    transitions.request_cancel(run.id, by="op")
    answered = transitions.settle(run.id, status="failed", reason="worker_shutdown", worker="w1")
    assert answered is SettleOutcome.CANCEL_WON and answered  # truthy: the settle did win
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.is_retryable) == ("cancelled", "cancelled", False)


@pytest.mark.django_db
def test_retire_refused_by_its_guard_is_not_due(state_in):
    # The watchdog retires "if still silent": a guard that no longer holds spares the run.
    from django.db.models import Q

    run = state_in("running")
    assert transitions.retire(run.id, by="watchdog", guard=Q(heartbeat_at__isnull=True)) is RetireOutcome.NOT_DUE
    assert Run.objects.get(pk=run.id).status == "running"


@pytest.mark.django_db
@pytest.mark.parametrize("reason", ["provider_failed", "worker_lost", "worker_shutdown"])
def test_every_retryable_failure_retries_once(running_run, reason):
    run = running_run()
    assert transitions.settle(run.id, status="failed", reason=reason, worker="w1") is SettleOutcome.SETTLED
    result = transitions.retry(run.id, by="op")
    assert result.outcome is RetryOutcome.RETRIED
    new = result.created
    assert new.status == "queued" and new.retry_of_id == run.id
    assert transitions.retry(run.id, by="op").outcome is RetryOutcome.ALREADY_RETRIED
    assert transitions.retry(run.id, by="op").created is None


@pytest.mark.django_db
@pytest.mark.parametrize("status", WAITING)
def test_cancel_of_a_released_wait_settles_at_once(released_in, status):
    # Nobody holds it to notice a flag: like a queued run, it is cancelled by the request.
    run = released_in(status)
    assert transitions.request_cancel(run.id, by="op") == CancelOutcome.SETTLED
    after = Run.objects.get(pk=run.id)
    assert (after.status, after.termination_reason, after.cancel_requested_by) == ("cancelled", "cancelled", "op")
    assert transitions.request_cancel(run.id, by="op") == CancelOutcome.ALREADY_TERMINAL


@pytest.mark.django_db
def test_a_released_wait_has_no_heartbeat_and_nobody_can_beat_for_it(released_in):
    run = released_in()
    assert (run.worker, run.heartbeat_at) == ("", None)
    assert transitions.heartbeat(run.id, worker="w1").held is False
    assert transitions.heartbeat(run.id, worker="").held is False
    assert Run.objects.get(pk=run.id).heartbeat_at is None


@pytest.mark.django_db
@pytest.mark.parametrize("status", [*STATUSES, "released"])
def test_expire_waits_ends_only_released_waits_past_their_deadline(run_in, released_in, status):
    run = released_in(timeout_s=-1) if status == "released" else run_in(status)
    Run.objects.filter(pk=run.id).update(wait_deadline=timezone.now() - timedelta(hours=1))  # every deadline passed
    before = snapshot(run.id)
    expired = transitions.expire_waits()
    if status == "released":
        assert expired == [run.id]
        after = Run.objects.get(pk=run.id)
        assert (after.status, after.termination_reason) == ("failed", "approval_denied")
        assert after.status in declared_targets("expire_wait", "waiting_for_approval")
    else:  # queued, running, a wait its holder keeps (an API agent's), terminal: untouched
        assert expired == []
        assert snapshot(run.id) == before


@pytest.mark.django_db
def test_expire_waits_leaves_a_wait_before_its_deadline(released_in):
    run = released_in(timeout_s=300)
    assert transitions.expire_waits() == []
    assert Run.objects.get(pk=run.id).status == "waiting_for_approval"


@pytest.mark.django_db
@pytest.mark.parametrize("status", STATUSES)
def test_heartbeat_from_every_status(run_in, status):
    run = run_in(status)
    beat = transitions.heartbeat(run.id, worker="w1")
    assert beat.held is (status in LIVE)
    assert beat.status == status
    assert transitions.heartbeat(run.id, worker="someone-else").held is False


def test_every_outcome_has_an_operator_label_and_a_kind():
    from runs.transitions.outcomes import ALL

    for outcomes in ALL:
        assert outcomes.NOT_FOUND.kind is Kind.NOT_FOUND
        for outcome in outcomes:
            assert outcome.label.strip() and outcome.label[0].isupper(), outcome
            assert bool(outcome) is (outcome.kind is Kind.DONE)
