"""Committing a step: the only way a Step row is written.

A step (model message plus all its tool results) is committed whole, at its boundary,
and only while the committing worker holds the run and no cancel is pending: once a
cancel is requested, nothing more is committed, so the step in flight is discarded.
"""

from decimal import Decimal

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from runs import budgets, events, loops
from runs.models import Run, Step
from runs.transitions._guard import E, S, parse_id, update_returning


def commit_step(run_id, *, worker, index, kind, text="", tool_calls=(), tokens_in=0, tokens_out=0, cost=0,
                charged=False):
    """Write step `index` and add it to the run's totals (and count as a heartbeat).
    Returns the Step, or None when the worker no longer holds the running run or a
    cancel is pending (nothing written). A commit that reaches one of the run's budgets
    asks it to stop (`runs.budgets`): the Step's `stopping` is then that StopOutcome
    (else None), so the committing worker stops at once rather than on the message. `charged`: the step's spend is in the totals
    already (added when its run parked for an approval); the Step still records it.
    Every tool call must carry its result (or error): half a tool call is never kept."""
    run_id = parse_id(run_id)
    if kind not in Step.Kind.values:
        raise ValueError(f"unknown step kind {kind!r}")
    for call in tool_calls:
        if "result" not in call and "error" not in call:
            raise ValueError(f"tool call {call.get('name')!r} has no result: not a committable step")
    cost = Decimal(str(cost))
    held = Run.objects.filter(
        pk=run_id, status=S.RUNNING, worker=worker, cancel_requested_at__isnull=True, steps=index
    )
    spend = {} if charged else {
        "tokens_in": F("tokens_in") + tokens_in, "tokens_out": F("tokens_out") + tokens_out, "cost": F("cost") + cost,
    }
    with transaction.atomic():
        # `steps=index` makes a replayed or out-of-order commit lose instead of leaving a gap.
        changed = run_id is not None and update_returning(
            held,
            fields=budgets.FIELDS,
            steps=F("steps") + 1,
            tool_calls=F("tool_calls") + len(tool_calls),
            **spend,
            heartbeat_at=Now(),  # a holder that commits is alive: it counts as a beat
        )
        if not changed:
            return None
        step = Step.objects.create(
            run_id=run_id,
            index=index,
            kind=kind,
            text=text,
            tool_calls=list(tool_calls),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=cost,
        )
        events.append(run_id, E.STEP_COMMITTED, actor=worker, index=index, kind=kind)
    step.stopping = budgets.enforce(changed[0])  # after commit: the stop is a transition of its own
    loops.after_commit(run_id, step, agent=changed[0].agent)  # loop detection, once committed; may set `stopping` too (runs.loops)
    return step


def record_discard(run_id, *, worker, index, text="", tool_calls=(), tokens_in=0, tokens_out=0, cost=0,
                   reason="cancelled", estimated=False):
    """Record a step the holder threw away (a cancel, a failure): its interrupted text,
    the tool calls it abandoned (names only: a half-done call is never kept) and what it
    cost, which counts in the run's totals since the provider charged it. Returns the
    `step_discarded` event, or None when `worker` does not hold the live run (nothing
    written). Engine runs write the same entry in their settle's transaction."""
    run_id = parse_id(run_id)
    cost = Decimal(str(cost))
    held = Run.objects.filter(pk=run_id, status__in=Run.LIVE, worker=worker)
    with transaction.atomic():
        changed = run_id is not None and update_returning(
            held,
            fields=budgets.FIELDS,
            tokens_in=F("tokens_in") + tokens_in,
            tokens_out=F("tokens_out") + tokens_out,
            cost=F("cost") + cost,
            heartbeat_at=Now(),
        )
        if not changed:
            return None
        event = events.append(
            run_id, E.STEP_DISCARDED, actor=worker, index=index, text=text, interrupted=True, reason=reason,
            tool_calls=list(tool_calls), tokens_in=tokens_in, tokens_out=tokens_out, cost=str(cost),
            estimated=estimated,
        )
    budgets.enforce(changed[0])  # paid for though thrown away: it counts against the budget
    return event
