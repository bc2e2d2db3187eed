"""A guardrail asks a run to stop: a budget reached, or the agent's loop policy.

The stop rides on the cancel request (`cancel_requested_at`, plus `stop_reason`), so it
is checked at the same checkpoints, delivered the same two ways (the control channel
and the heartbeat's answer), refused to further step commits, and escalated by the
watchdog if ignored, exactly like an abort. Only its ending differs: the money ran out
(completed/budget_exhausted, truncated) or a policy refused (failed/policy_denied);
never cancelled, and an operator's abort already pending keeps its own ending.
"""

from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Now

from runs import messages, rules
from runs.models import Run
from runs.transitions._guard import UNHELD, E, R, S, actor_name, guarded, refused, standing
from runs.transitions.outcomes import StopOutcome

ENDINGS = {R.BUDGET_EXHAUSTED: (S.COMPLETED, True), R.POLICY_DENIED: (S.FAILED, False)}


def request_stop(run_id, *, reason, limit, by="guardrail", source=Run.CancelSource.GUARDRAIL, note="",
                 evidence=None):
    """Ask a run to stop for `reason` (BUDGET_EXHAUSTED or POLICY_DENIED) because of
    `limit` (tokens, cost, tool_calls, wall_clock, agent_tokens_24h, agent_cost_24h,
    loop). A held live run is flagged and its worker told (REQUESTED); one nobody holds
    (queued, or a wait the engine released) ends at once (SETTLED); ALREADY_STOPPING when
    an abort or a stop is pending (nothing written); ALREADY_TERMINAL / NOT_FOUND.
    Writes `stop_requested` with {reason, limit, note, **evidence}."""
    if reason not in ENDINGS:
        raise ValueError(f"{reason!r} is not a stop reason: one of {', '.join(ENDINGS)}")
    if source not in Run.CancelSource.values:
        raise ValueError(f"unknown source {source!r}")
    actor, note = actor_name(by), (note or "")[:rules.NOTE_LIMIT]
    status, truncated = ENDINGS[reason]

    def if_unheld(then, otherwise):
        # SET expressions see the row as it was, so every CASE tests the old status.
        return Case(When(UNHELD, then=then), default=otherwise)

    run = guarded(
        run_id,
        "request_stop",
        guard=Q(cancel_requested_at__isnull=True),
        event=E.STOP_REQUESTED,
        actor=actor,
        source=source,
        data=lambda run: {"reason": reason, "limit": limit, "note": note, **(evidence or {}),
                          **({"settled_queued": True} if run.is_terminal else {})},
        to_worker=lambda run: None if run.is_terminal else messages.cancel(run),
        cancel_requested_at=Now(),
        cancel_requested_by=actor,
        cancel_source=source,
        cancel_note=note,
        stop_reason=reason,
        status=if_unheld(Value(status), F("status")),
        termination_reason=if_unheld(Value(reason), F("termination_reason")),
        truncated=if_unheld(Value(truncated), F("truncated")),
        finished_at=if_unheld(Now(), F("finished_at")),
    )
    if run is not None:
        return StopOutcome.SETTLED if run.is_terminal else StopOutcome.REQUESTED
    return refused(standing(run_id), StopOutcome, StopOutcome.ALREADY_STOPPING)
