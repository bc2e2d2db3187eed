"""The guard behind every transition: the one helper that does the conditional UPDATE
(allowed sources from `table.ALLOWED_FROM`), writes the event and schedules the broadcast."""

import logging
import uuid
from dataclasses import dataclass

from django.db import connections, router, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery

from runs import broadcast, events
from runs.alerts import outbox
from runs.models import Run, RunEvent, RunInput
from runs.transitions.table import ALLOWED_FROM

log = logging.getLogger("runs.transitions")

S = Run.Status
R = Run.TerminationReason
E = RunEvent.Kind

# Runs no worker holds: a queued one, or a waiting one the engine released. A cancel
# settles these at once, since nobody is there to notice it.
UNHELD = Q(status=S.QUEUED) | Q(status__in=Run.WAITING, worker="")


@dataclass(frozen=True)
class Heartbeat:
    held: bool  # False once the run is terminal or held by another worker: stop working on it
    cancel_requested: bool  # the slow path of cancel delivery
    status: str = ""  # "" when the run does not exist
    stop: str = ""  # with cancel_requested: a guardrail's stop reason ("" for an abort)


def parse_id(run_id):
    """A UUID, or None for anything that is not one (callers answer NOT_FOUND)."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        return None


def standing(run_id, *fields):
    """The row's status (and `fields`) as it stands, or None: read once by a transition
    whose guard refused, to say why in its outcome."""
    run_id = parse_id(run_id)
    return Run.objects.filter(pk=run_id).values("status", *fields).first() if run_id else None


def refused(row, outcomes, live):
    """The outcome for a refusal, by where the row stands: NOT_FOUND, ALREADY_TERMINAL,
    or `live` (the verb's own "not in the state I start from")."""
    if row is None:
        return outcomes.NOT_FOUND
    if row["status"] in Run.TERMINAL:
        return outcomes.ALREADY_TERMINAL
    return live


def origin(client):
    """The event data saying from which address an operator acted (the forwarded one
    behind a trusted proxy, as the caller resolved it): {} when not given."""
    return {"client": str(client)[:64]} if client else {}


def actor_name(by):
    if by is None:
        return ""
    if hasattr(by, "get_username"):
        return by.get_username()
    return str(by)[:150]


def guarded(run_id, verb, *, event, guard=None, actor="", source="", data=None, to_worker=None, **changes):
    """The one conditional UPDATE behind every transition.

    Returns the run as it stands after the change, or None when the guard refused
    (wrong status, another worker, no such run): then nothing was written. `data` is
    the event's payload, or a function of the changed run giving it (for a verb whose
    outcome is decided inside the UPDATE). `to_worker`, a function of the changed run,
    gives the message (`runs.messages`) its executor must get after commit, or None:
    the transition says who is told.
    """
    run_id = parse_id(run_id)
    if run_id is None:
        return None
    rows = Run.objects.filter(pk=run_id, status__in=ALLOWED_FROM[verb])
    if guard is not None:
        rows = rows.filter(guard)
    with transaction.atomic():
        changed = update_returning(rows, event_seq=F("event_seq") + 1, **changes)
        if not changed:
            return None
        run = changed[0]  # the guard names one run by its primary key
        payload = {"status": run.status, **((data(run) if callable(data) else data) or {})}
        if run.is_terminal:
            payload["reason"] = run.termination_reason
        event_row = RunEvent.objects.create(
            run=run, seq=run.event_seq, kind=event, actor=actor, source=source, data=payload
        )
        outbox.record(run, event_row)  # same transaction: a rolled-back change alerts nobody
        if run.status in (S.FAILED, S.CANCELLED):
            resolve_queued_inputs(run)
        broadcast.on_commit(run, event_row, to_worker=to_worker(run) if to_worker else None)
    return run


def update_returning(rows, *, fields=None, **changes):
    """`rows.update(**changes)` answering the runs as the UPDATE left them (`UPDATE …
    RETURNING`, PostgreSQL and SQLite >= 3.35): a list, empty when no row matched. The
    ORM's update() only counts rows, which cost every winner a re-read. `fields`: only
    these columns (and the key) come back, the others deferred — for a hot path that
    reads a few (building all ~50 fields of a Run costs a step commit a third more)."""
    using = router.db_for_write(Run)
    query = rows.query.chain(UpdateQuery)
    query.add_update_values(changes)
    compiler = query.get_compiler(using)
    compiler.pre_sql_setup()
    sql, params = compiler.as_sql()
    quote = connections[using].ops.quote_name
    wanted = Run._meta.concrete_fields if fields is None else [
        field for field in Run._meta.concrete_fields if field.primary_key or field.name in fields
    ]
    columns = ", ".join(quote(field.column) for field in wanted)
    # raw() applies each field's database converters (dates, JSON, decimals on SQLite).
    return list(Run.objects.raw(f"{sql} RETURNING {columns}", params, using=using))


def resolve_queued_inputs(run):
    """An abnormal ending cancels still-queued inputs, exactly once, with the reason."""
    resolution = (
        RunInput.Resolution.FAILED if run.status == S.FAILED else RunInput.Resolution.INTERRUPTED
    )
    queued = RunInput.objects.filter(run=run, status=RunInput.Status.QUEUED)
    ids = list(queued.values_list("pk", flat=True))
    if not ids:
        return
    # The status guard makes a second resolution a no-op: inputs are never resolved twice.
    resolved = RunInput.objects.filter(pk__in=ids, status=RunInput.Status.QUEUED).update(
        status=RunInput.Status.CANCELLED, resolution=resolution, resolved_at=Now()
    )
    if resolved:
        events.append(run.id, E.INPUT_CANCELLED, inputs=ids, resolution=resolution)


def terminal(status, reason):
    return {"status": status, "termination_reason": reason, "finished_at": Now()}


# A guardrail's stop rides on the cancel request (`stop_reason` is set only with it).
STOPPED_BY_BUDGET, STOPPED_BY_POLICY = Q(stop_reason=R.BUDGET_EXHAUSTED), Q(stop_reason=R.POLICY_DENIED)
PENDING = Q(cancel_requested_at__isnull=False)


def _by_request(budget, policy, cancel, otherwise):
    return Case(
        When(STOPPED_BY_BUDGET, then=Value(budget)),
        When(STOPPED_BY_POLICY, then=Value(policy)),
        When(PENDING, then=Value(cancel)),
        default=Value(otherwise),
    )


def stopped_or(status, reason, truncated=False):
    """How a run ends when a request to stop is pending: an abort's cancelled/cancelled,
    or a guardrail stop's own ending (the money ran out: completed/budget_exhausted,
    truncated; a loop policy: failed/policy_denied); `status`/`reason` when none is.
    Evaluated inside the UPDATE, so no read can go stale."""
    return {
        "status": _by_request(S.COMPLETED, S.FAILED, S.CANCELLED, status),
        "termination_reason": _by_request(R.BUDGET_EXHAUSTED, R.POLICY_DENIED, R.CANCELLED, reason),
        "truncated": _by_request(True, False, False, truncated),
        "finished_at": Now(),
    }


def cancel_wins(failed_reason):
    """A failure arriving while a cancel (or a guardrail stop) is pending is recorded as
    that request's ending: the stop came first."""
    return stopped_or(S.FAILED, failed_reason)
