"""Ending a waiting run nobody answered: the watchdog's half of a released wait.

A run the engine released while it waits (`suspend(release=True)`) has no worker to
time it out, so its `wait_deadline` (set on the database clock) is enforced here.
"""

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from runs import events
from runs.models import Run
from runs.transitions._guard import ALLOWED_FROM, E, R, S, cancel_wins, guarded, log

EXPIRED = {
    S.WAITING_FOR_APPROVAL: ("ApprovalTimeout", "no answer to approve {tool} before the deadline"),
    # An unanswered input ends approval_denied too: of the reasons in the table it is
    # the one for "a human answer the run needed never came". `cancelled` would say
    # somebody stopped it; worker_lost and provider_failed are retryable malfunctions,
    # and a retry would only ask again. error_class tells the two waits apart.
    S.WAITING_FOR_INPUT: ("InputTimeout", "no input before the deadline"),
}


def expire_waits(*, limit=500):
    """Settle released waiting runs past their `wait_deadline` as failed /
    approval_denied. The deadline, the release and the waiting status are re-checked
    inside each UPDATE, so an answer landing at the same moment wins, exactly once
    (the loser of the two changes nothing). Returns the ids it settled."""
    due = Q(worker="", wait_deadline__lt=Now())
    rows = Run.objects.filter(due, status__in=ALLOWED_FROM["expire_wait"])
    expired = []
    for run_id, status, request in rows.values_list("pk", "status", "pending_request")[:limit]:
        request = request or {}
        error_class, message = EXPIRED[status]
        with transaction.atomic():
            run = guarded(
                run_id,
                "expire_wait",
                event=E.SETTLED,
                guard=due,
                actor="watchdog",
                source=Run.CancelSource.WATCHDOG,
                data={"expired": status, "error_class": error_class},
                error_class=error_class,
                error_message=message.format(tool=request.get("tool") or "the tool call"),
                **cancel_wins(R.APPROVAL_DENIED),
            )
            if run is None:
                continue
            step = (request.get("resume") or {}).get("step")
            if step:  # the gated reply is never committed; its spend was charged when it parked
                events.append(
                    run_id, E.STEP_DISCARDED, actor="watchdog", index=step["index"], text=step.get("text", ""),
                    interrupted=True, reason="expired", tool_calls=[c["name"] for c in step.get("tool_calls", [])],
                    tokens_in=step.get("tokens_in", 0), tokens_out=step.get("tokens_out", 0),
                    cost=step.get("cost", "0"), estimated=False,
                )
        log.info("run %s: no answer before its wait deadline; failed/approval_denied", run_id)
        expired.append(run_id)
    return expired
