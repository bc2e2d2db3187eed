"""Runs as the API shows them, and the 409 bodies that say what stands."""

from runs.api.errors import error_body
from runs.models import Run


def cancel_info(run):
    """The pending cancel request of `run` as a dict, or None."""
    if run.cancel_requested_at is None:
        return None
    return {
        "requested_at": run.cancel_requested_at,
        "by": run.cancel_requested_by,
        "source": run.cancel_source,
        "note": run.cancel_note,
        "stop_reason": run.stop_reason or None,
    }


def run_out(run):
    return {
        "id": str(run.pk),
        "agent": run.agent,
        "title": run.title,
        "input": run.input,
        "status": run.status,
        "termination_reason": run.termination_reason,
        "truncated": run.truncated,
        "worker": run.worker,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "heartbeat_at": run.heartbeat_at,
        "cancel": cancel_info(run),
        "max_iterations": run.max_iterations,
        "token_budget": run.token_budget,
        "cost_budget": float(run.cost_budget) if run.cost_budget is not None else None,
        "deadline": run.deadline,
        "tool_call_budget": run.tool_call_budget,
        "totals": {
            "tokens_in": run.tokens_in,
            "tokens_out": run.tokens_out,
            "cost": float(run.cost),
            "steps": run.steps,
            "tool_calls": run.tool_calls,
        },
        "error_class": run.error_class,
        "error_message": run.error_message,
        "retry_of": str(run.retry_of_id) if run.retry_of_id else None,
    }


# How an agent settles when a guardrail's stop is pending, as the 409 says it.
STOP_ENDINGS = {
    Run.TerminationReason.BUDGET_EXHAUSTED: "completed/budget_exhausted (truncated)",
    Run.TerminationReason.POLICY_DENIED: "failed/policy_denied",
}


def conflict(run, worker, *, index=None, **extra):
    """Why a guarded change by `worker` on `run` (re-read now) lost, as a 409 body.

    The most useful reason first: an ended run says how it ended; a pending cancel
    tells the agent to stop and settle cancelled (a guardrail's stop: with its reason,
    `stop_reason`, beside the same code, so a client that knows only cancels still stops)."""
    run = Run.objects.get(pk=run.pk)
    fields = {}
    if run.is_terminal:
        code, message = "run_ended", f"the run already ended: {run.status} / {run.reason_label}"
    elif run.status == Run.Status.QUEUED:
        code, message = "not_claimed", "the run is queued: claim it first"
    elif run.worker != worker:
        code, message = "not_held", "another worker holds this run"
    elif run.cancel_requested_at is not None and run.stop_reason:
        ending = STOP_ENDINGS.get(run.stop_reason, run.stop_reason)
        code, message = "cancel_requested", f"a guardrail's stop is pending: discard the step in flight and settle {ending}"
        extra = {"stop_reason": run.stop_reason, **extra}
    elif run.cancel_requested_at is not None:
        code, message = "cancel_requested", "a cancel is pending: discard the step in flight and settle cancelled/cancelled"
    elif index is not None and run.steps != index:
        code, message = "wrong_index", f"the next step index is {run.steps}"
        fields["index"] = f"expected {run.steps}"
    elif run.status != Run.Status.RUNNING:
        code, message = "not_running", f"the run is {run.status}"
    else:
        code, message = "conflict", "the change lost to a concurrent one; re-read the run"
    return {
        **error_body(409, message, code=code, fields=fields),
        "status": run.status,
        "reason": run.termination_reason,
        **extra,
    }
