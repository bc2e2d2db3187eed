"""The full transition table: every (from status, transition) pair, allowed or refused.

A refused transition changes nothing: the row is compared field by field.
"""

from datetime import timedelta

import pytest
from django.forms.models import model_to_dict

from runs import transitions
from runs.models import Run
from runs.transitions import CancelOutcome
from tests.runs.conftest import LONG_AGO, STATUSES

WAITING = ("waiting_for_input", "waiting_for_approval")
LIVE = ("running", *WAITING)
TERMINAL = ("completed", "failed", "cancelled")

# transition -> (statuses it is allowed from, status it leads to or None for "unchanged")
TABLE = {
    "claim": (("queued",), "running"),
    "suspend": (("running",), "waiting_for_approval"),
    "resume": (WAITING, "running"),
    "settle": (LIVE, "completed"),
    "force_cancel": (("queued", *LIVE), "cancelled"),
    "reap": (("running",), "failed"),
}


def attempt(name, run):
    if name == "claim":
        return transitions.claim(run.id, worker="w2")
    if name == "suspend":
        return transitions.suspend(run.id, worker="w1", status="waiting_for_approval")
    if name == "resume":
        return transitions.resume(run.id, by="op", answer={"approved": True})
    if name == "settle":
        return transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    if name == "force_cancel":
        return transitions.force_cancel(run.id, by="op")
    if name == "reap":
        return run.id in transitions.reap_stale(older_than=LONG_AGO)
    raise AssertionError(name)


def snapshot(run_id):
    row = model_to_dict(Run.objects.get(pk=run_id))
    row.pop("event_seq")  # a refused settle appends `late_settle_ignored`: only the seq moves
    return row


@pytest.mark.django_db
@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("name", sorted(TABLE))
def test_transition_table(run_in, status, name):
    allowed_from, to = TABLE[name]
    run = run_in(status)
    before = snapshot(run.id)
    won = attempt(name, run)
    after = Run.objects.get(pk=run.id)
    if status in allowed_from:
        assert won is True
        assert after.status == to
    else:
        assert won is False
        assert snapshot(run.id) == before


# The same verbs on a waiting run the engine released (no holder): only an answer, a
# cancel or a retire moves it, and an answer queues it again for any worker.
RELEASED = {"claim": None, "suspend": None, "resume": "queued", "settle": None, "force_cancel": "cancelled", "reap": None}


@pytest.mark.django_db
@pytest.mark.parametrize("status", WAITING)
@pytest.mark.parametrize("name", sorted(RELEASED))
def test_transition_table_of_released_waits(released_in, status, name):
    run = released_in(status)
    before = snapshot(run.id)
    won = attempt(name, run)
    to = RELEASED[name]
    if to is None:
        assert won is False
        assert snapshot(run.id) == before
    else:
        assert won is True
        assert Run.objects.get(pk=run.id).status == to


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
    Run.objects.filter(pk=run.id).update(wait_deadline=LONG_AGO_AT())  # every deadline passed
    before = snapshot(run.id)
    expired = transitions.expire_waits()
    if status == "released":
        assert expired == [run.id]
        after = Run.objects.get(pk=run.id)
        assert (after.status, after.termination_reason) == ("failed", "approval_denied")
    else:  # queued, running, a wait its holder keeps (an API agent's), terminal: untouched
        assert expired == []
        assert snapshot(run.id) == before


@pytest.mark.django_db
def test_expire_waits_leaves_a_wait_before_its_deadline(released_in):
    run = released_in(timeout_s=300)
    assert transitions.expire_waits() == []
    assert Run.objects.get(pk=run.id).status == "waiting_for_approval"


def LONG_AGO_AT():  # noqa: N802 - reads as the constant it stands for
    from django.utils import timezone

    return timezone.now() - timedelta(hours=1)


EXPECTED_CANCEL = {
    "queued": (CancelOutcome.SETTLED, "cancelled"),
    "running": (CancelOutcome.REQUESTED, "running"),
    "waiting_for_input": (CancelOutcome.REQUESTED, "waiting_for_input"),
    "waiting_for_approval": (CancelOutcome.REQUESTED, "waiting_for_approval"),
    "completed": (CancelOutcome.ALREADY_TERMINAL, "completed"),
    "failed": (CancelOutcome.ALREADY_TERMINAL, "failed"),
    "cancelled": (CancelOutcome.ALREADY_TERMINAL, "cancelled"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("status", STATUSES)
def test_escalate_cancel_from_every_status(run_in, status):
    """Only a live run with a pending cancel can be escalated, and only once."""
    run = run_in(status)
    if status in LIVE:
        assert transitions.escalate_cancel(run.id) is False  # no cancel pending: nothing to escalate
        transitions.request_cancel(run.id, by="op")
    before = snapshot(run.id)
    won = transitions.escalate_cancel(run.id)
    after = Run.objects.get(pk=run.id)
    if status in LIVE:
        assert won is True and after.status == status and after.cancel_escalated_at is not None
        assert transitions.escalate_cancel(run.id) is False
    else:
        assert won is False and snapshot(run.id) == before


@pytest.mark.django_db
@pytest.mark.parametrize("status", STATUSES)
def test_request_cancel_from_every_status(run_in, status):
    run = run_in(status)
    outcome, then = EXPECTED_CANCEL[status]
    assert transitions.request_cancel(run.id, by="op") == outcome
    after = Run.objects.get(pk=run.id)
    assert after.status == then
    if outcome == CancelOutcome.REQUESTED:
        assert after.is_cancelling
        assert transitions.request_cancel(run.id, by="op") == CancelOutcome.ALREADY_REQUESTED


@pytest.mark.django_db
@pytest.mark.parametrize("status", STATUSES)
def test_heartbeat_from_every_status(run_in, status):
    run = run_in(status)
    beat = transitions.heartbeat(run.id, worker="w1")
    assert beat.held is (status in LIVE)
    assert beat.status == status
    assert transitions.heartbeat(run.id, worker="someone-else").held is False


@pytest.mark.django_db
@pytest.mark.parametrize("status", STATUSES)
def test_retry_only_from_retryable_terminal(run_in, status):
    run = run_in(status)
    new = transitions.retry(run.id, by="op")
    if status == "failed":  # provider_failed: retryable
        assert new is not None and new.status == "queued" and new.retry_of_id == run.id
        assert transitions.retry(run.id, by="op") is None  # once
    else:
        assert new is None
    assert Run.objects.get(pk=run.id).status == status  # the original row is never reused


@pytest.mark.django_db
@pytest.mark.parametrize("reason", ["provider_failed", "worker_lost", "worker_shutdown"])
def test_every_retryable_failure_retries_once(make_run, reason):
    run = make_run()
    assert transitions.claim(run.id, worker="w1")
    assert transitions.settle(run.id, status="failed", reason=reason, worker="w1")
    new = transitions.retry(run.id, by="op")
    assert new is not None and new.status == "queued" and new.retry_of_id == run.id
    assert transitions.retry(run.id, by="op") is None


@pytest.mark.django_db
def test_a_shutdown_failure_with_a_cancel_pending_settles_cancelled(make_run):
    run = make_run()
    assert transitions.claim(run.id, worker="w1")
    assert transitions.request_cancel(run.id, by="op") == CancelOutcome.REQUESTED
    assert transitions.settle(run.id, status="failed", reason="worker_shutdown", worker="w1")
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.is_retryable) == ("cancelled", "cancelled", False)


@pytest.mark.django_db
def test_unknown_and_malformed_ids_are_not_found(db):
    for bad in ("not-a-uuid", "00000000-0000-0000-0000-000000000000", "", None):
        assert transitions.request_cancel(bad) == CancelOutcome.NOT_FOUND
        assert transitions.settle(bad, status="completed", reason="completed") is False
        assert transitions.force_cancel(bad) is False
        assert transitions.claim(bad, worker="w") is False
        assert transitions.heartbeat(bad, worker="w").held is False
        assert transitions.retry(bad) is None
