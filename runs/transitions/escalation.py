"""Escalating a cancel that a live worker ignores, as a supervisor would.

    requested ──grace──▶ not honoured: the worker is told to stop hard ──escalate──▶ retired

`RUNWARDEN_CANCEL_GRACE_S` after the request the watchdog calls `escalate_cancel`
(once: the guard is `cancel_escalated_at IS NULL`), which writes `cancel_not_honoured`
on the timeline and sends the worker a hard stop; `RUNWARDEN_CANCEL_ESCALATE_S` after
that it retires the run (`force_cancel`), whose late settle then loses and is traced.
"""

from django.db.models import Q
from django.db.models.functions import Now

from runs import messages
from runs.transitions._guard import E, guarded


def escalate_cancel(run_id, *, by="watchdog", grace_s=None):
    """Mark a live run's pending cancel as not honoured and ask its worker to stop
    hard. True once per run; False when it has ended, has no pending cancel, or was
    escalated already (another watchdog won)."""
    run = guarded(
        run_id,
        "escalate_cancel",
        event=E.CANCEL_NOT_HONOURED,
        guard=Q(cancel_requested_at__isnull=False, cancel_escalated_at__isnull=True),
        actor=str(by),
        source="watchdog",
        data={"action": "hard stop asked", **({"grace_s": grace_s} if grace_s is not None else {})},
        cancel_escalated_at=Now(),
        to_worker=messages.hard_stop,
    )
    return run is not None
