"""After and beside the lifecycle: retry a run, queue and consume its inputs."""

from django.db import transaction
from django.db.models.functions import Now

from runs import events, rules
from runs.models import Run, RunInput
from runs.transitions._guard import ALLOWED_FROM, E, actor_name, origin, parse_id, refused, standing
from runs.transitions.outcomes import InputOutcome, Result, RetryOutcome
from runs.transitions.lifecycle import create_run


def retry(run_id, *, by=None, source=Run.CancelSource.DASHBOARD, client=""):
    """Queue a fresh run copying a terminal, retryable one (linked by `retry_of`),
    once per run: `Result(RETRIED, new run)`, else `Result(outcome)` with
    ALREADY_RETRIED, NOT_RETRYABLE, NOT_ENDED or NOT_FOUND."""
    run_id = parse_id(run_id)
    if run_id is None:
        return Result(RetryOutcome.NOT_FOUND)
    once = Run.objects.filter(rules.RETRYABLE, pk=run_id)
    with transaction.atomic():
        if not once.update(retried_at=Now()):
            return Result(_not_retried(run_id))
        original = Run.objects.get(pk=run_id)
        new = create_run(
            agent=original.agent,
            title=original.title,
            input=original.input,
            max_iterations=original.max_iterations,
            token_budget=original.token_budget,
            cost_budget=original.cost_budget,
            tool_call_budget=original.tool_call_budget,
            retry_of=original,
        )
        events.append(original.id, E.RETRIED, actor=actor_name(by), source=source, new_run=str(new.id),
                      **origin(client))
    return Result(RetryOutcome.RETRIED, new)


def _not_retried(run_id):
    row = standing(run_id, "termination_reason", "retried_at")
    if row is None:
        return RetryOutcome.NOT_FOUND
    if row["status"] not in Run.TERMINAL:
        return RetryOutcome.NOT_ENDED
    if row["termination_reason"] not in Run.RETRYABLE:
        return RetryOutcome.NOT_RETRYABLE
    return RetryOutcome.ALREADY_RETRIED


def queue_input(run_id, *, kind, payload, by=None, source=Run.CancelSource.DASHBOARD, client=""):
    """Queue an operator input for a run that has not ended: `Result(QUEUED, the
    RunInput)`, else `Result(ALREADY_TERMINAL)` or `Result(NOT_FOUND)`."""
    run_id = parse_id(run_id)
    with transaction.atomic():
        live = Run.objects.filter(pk=run_id, status__in=ALLOWED_FROM["queue_input"])
        # Lock the run row so a settle cannot slip between the check and the insert and
        # strand the input as queued forever (settle takes the same row in its UPDATE).
        if run_id is None or not live.select_for_update().exists():
            return Result(refused(standing(run_id), InputOutcome, InputOutcome.ALREADY_TERMINAL))
        item = RunInput.objects.create(run_id=run_id, kind=kind, payload=payload, created_by=actor_name(by))
        events.append(run_id, E.INPUT_QUEUED, actor=actor_name(by), source=source, input=item.pk, kind=kind,
                      **origin(client))
    return Result(InputOutcome.QUEUED, item)


def consume_inputs(run_id, *, kind=None):
    """Take the run's queued inputs (oldest first), each exactly once."""
    with transaction.atomic():
        queued = RunInput.objects.filter(run_id=run_id, status=RunInput.Status.QUEUED)
        if kind:
            queued = queued.filter(kind=kind)
        items = list(queued.select_for_update().order_by("created_at", "id"))
        RunInput.objects.filter(pk__in=[i.pk for i in items], status=RunInput.Status.QUEUED).update(
            status=RunInput.Status.CONSUMED, resolved_at=Now()
        )
    return items
