"""Every change of a run's status, each one guarded.

A transition is one conditional UPDATE (`WHERE id = … AND status IN (<allowed from>)`,
plus any extra guard such as "held by this worker") whose row count says whether it
won. The winner writes the run's event in the same transaction and broadcasts after
commit; a loser changes nothing. There is no read-modify-write of status anywhere:
terminal is terminal, and a late settle keeps the first outcome.

    verb            from                       to
    create_run      -                          queued
    claim(_next)    queued                     running
    heartbeat       running, waiting_*         (same)      held by the worker
    request_cancel  queued                     cancelled   nobody holds it: settle now
    request_cancel  running, waiting_*         (same) + cancel_requested_at
    suspend         running                    waiting_*   held by the worker, no cancel pending
    resume          waiting_*                  running     claimed once
    settle          running, waiting_*         completed / failed / cancelled
    force_cancel    any non-terminal           cancelled   retire: the worker is gone
    reap_stale      running, stale heartbeat   failed / worker_lost
    retry           terminal + retryable       new queued run (retry_of), once
"""

import enum
import logging
import uuid
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from channels.db import database_sync_to_async
from django.db import transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Coalesce, Now

from runs import broadcast, events
from runs.models import Run, RunEvent, RunInput

log = logging.getLogger(__name__)

S = Run.Status
R = Run.TerminationReason
E = RunEvent.Kind

ALLOWED_FROM = {
    "claim": (S.QUEUED,),
    "heartbeat": Run.LIVE,
    "cancel_queued": (S.QUEUED,),
    "request_cancel": Run.LIVE,
    "suspend": (S.RUNNING,),
    "resume": Run.WAITING,
    "settle": Run.LIVE,
    "force_cancel": Run.NON_TERMINAL,
    "reap": (S.RUNNING,),
}
TOTALS = ("tokens_in", "tokens_out", "cost", "steps", "tool_calls")
ERROR_MESSAGE_LIMIT = 2000


class CancelOutcome(enum.StrEnum):
    REQUESTED = "requested"  # a live run: its worker will stop at its next checkpoint
    ALREADY_REQUESTED = "already_requested"  # asked before; still cancelling
    SETTLED = "settled"  # it was queued: cancelled at once
    ALREADY_TERMINAL = "already_terminal"  # it had ended; nothing changed
    NOT_FOUND = "not_found"  # no such run (or a malformed id)


@dataclass(frozen=True)
class Heartbeat:
    held: bool  # False once the run is terminal or held by another worker: stop working on it
    cancel_requested: bool  # the slow path of cancel delivery
    status: str = ""  # "" when the run does not exist


def parse_id(run_id):
    """A UUID, or None for anything that is not one (callers answer NOT_FOUND)."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        return None


def _actor(by):
    if by is None:
        return ""
    if hasattr(by, "get_username"):
        return by.get_username()
    return str(by)[:150]


def _guarded(run_id, verb, *, event, guard=None, actor="", source="", data=None, **changes):
    """The one conditional UPDATE behind every transition.

    Returns the run as it stands after the change, or None when the guard refused
    (wrong status, another worker, no such run): then nothing was written.
    """
    run_id = parse_id(run_id)
    if run_id is None:
        return None
    rows = Run.objects.filter(pk=run_id, status__in=ALLOWED_FROM[verb])
    if guard is not None:
        rows = rows.filter(guard)
    with transaction.atomic():
        if not rows.update(event_seq=F("event_seq") + 1, **changes):
            return None
        run = Run.objects.get(pk=run_id)
        payload = {"status": run.status, **(data or {})}
        if run.is_terminal:
            payload["reason"] = run.termination_reason
        event_row = RunEvent.objects.create(
            run=run, seq=run.event_seq, kind=event, actor=actor, source=source, data=payload
        )
        if run.status in (S.FAILED, S.CANCELLED):
            _resolve_queued_inputs(run)
        broadcast.on_commit(run, event_row)
    return run


def _resolve_queued_inputs(run):
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


def _terminal(status, reason):
    return {"status": status, "termination_reason": reason, "finished_at": Now()}


# --- create, claim, heartbeat ---------------------------------------------------------------


def create_run(
    *,
    agent,
    title="",
    input=None,
    max_iterations=None,
    token_budget=None,
    cost_budget=None,
    deadline=None,
    retry_of=None,
):
    """Create a queued run and its `created` event. Raises ValueError for bad limits."""
    agent = (agent or "").strip()
    if not agent or len(agent) > 100:
        raise ValueError("agent must be a non-empty name of at most 100 characters")
    for name, value in (("max_iterations", max_iterations), ("token_budget", token_budget)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer")
    if cost_budget is not None:
        try:
            cost_budget = Decimal(str(cost_budget))
        except InvalidOperation:
            raise ValueError("cost_budget must be a number") from None
        if not cost_budget.is_finite() or cost_budget <= 0:
            raise ValueError("cost_budget must be a positive number")
    with transaction.atomic():
        run = Run.objects.create(
            agent=agent,
            title=(title or "")[:300],
            input=input if input is not None else {},
            max_iterations=max_iterations,
            token_budget=token_budget,
            cost_budget=cost_budget,
            deadline=deadline,
            retry_of=retry_of,
            event_seq=1,
        )
        data = {"status": run.status}
        if retry_of is not None:
            data["retry_of"] = str(retry_of.pk)
        created = RunEvent.objects.create(run=run, seq=1, kind=E.CREATED, data=data)
        broadcast.on_commit(run, created)
    return run


def claim(run_id, *, worker):
    """Take a queued run for `worker`. False when it is not queued any more."""
    return _claim(run_id, worker) is not None


def _claim(run_id, worker):
    return _guarded(
        run_id,
        "claim",
        event=E.CLAIMED,
        actor=worker,
        status=S.RUNNING,
        worker=worker,
        started_at=Now(),
        heartbeat_at=Now(),
    )


def claim_next(*, worker, agents=None):
    """Claim the oldest queued run (of `agents`, if given); None when there is none.

    On PostgreSQL the candidate is locked with FOR UPDATE SKIP LOCKED so many workers
    claim different runs without waiting on each other; SQLite serialises writers with
    IMMEDIATE transactions instead. Either way the UPDATE re-checks `status = queued`.
    """
    for _ in range(5):
        with transaction.atomic():
            queued = Run.objects.filter(status=S.QUEUED)
            if agents:
                queued = queued.filter(agent__in=list(agents))
            candidate = (
                queued.order_by("created_at")
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)
                .first()
            )
            if candidate is None:
                return None
            run = _claim(candidate, worker)
            if run is not None:
                return run
    return None


def heartbeat(run_id, *, worker):
    """Record that `worker` is alive on the run; answer whether it still holds it and
    whether a cancel is pending (the slow path, for when the fast one is down)."""
    run_id = parse_id(run_id)
    if run_id is None:
        return Heartbeat(held=False, cancel_requested=False)
    beat = Run.objects.filter(pk=run_id, status__in=ALLOWED_FROM["heartbeat"], worker=worker)
    updated = beat.update(heartbeat_at=Now())
    row = Run.objects.filter(pk=run_id).values("status", "worker", "cancel_requested_at").first()
    if row is None:
        return Heartbeat(held=False, cancel_requested=False)
    held = bool(updated) and row["status"] in Run.LIVE and row["worker"] == worker
    return Heartbeat(
        held=held, cancel_requested=row["cancel_requested_at"] is not None, status=row["status"]
    )


# --- cancel, retire, reap ---------------------------------------------------------------------


def request_cancel(run_id, *, by=None, source=Run.CancelSource.USER, note=""):
    """Ask a run to stop. A queued run is cancelled at once (SETTLED); a live one is
    flagged and its worker signalled (REQUESTED); asking twice is ALREADY_REQUESTED."""
    if source not in Run.CancelSource.values:
        raise ValueError(f"unknown cancel source {source!r}")
    actor, note = _actor(by), (note or "")[:500]
    request = {
        "cancel_requested_at": Now(),
        "cancel_requested_by": actor,
        "cancel_source": source,
        "cancel_note": note,
    }
    common = {"event": E.CANCEL_REQUESTED, "actor": actor, "source": source}
    settled = _guarded(
        run_id,
        "cancel_queued",
        data={"note": note, "settled_queued": True},
        **common,
        **request,
        **_terminal(S.CANCELLED, R.CANCELLED),
    )
    if settled is not None:
        return CancelOutcome.SETTLED
    requested = _guarded(
        run_id,
        "request_cancel",
        guard=Q(cancel_requested_at__isnull=True),
        data={"note": note},
        **common,
        **request,
    )
    if requested is not None:
        return CancelOutcome.REQUESTED
    run_id = parse_id(run_id)
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first() if run_id else None
    if status is None:
        return CancelOutcome.NOT_FOUND
    if status in Run.TERMINAL:
        return CancelOutcome.ALREADY_TERMINAL
    return CancelOutcome.ALREADY_REQUESTED


def force_cancel(run_id, *, by=None, note="", source=Run.CancelSource.USER):
    """Retire a run whose worker is gone: any non-terminal run becomes cancelled now.
    The totals it reached are kept. False when it had already ended."""
    actor, note = _actor(by), (note or "")[:500]
    no_request = Q(cancel_requested_at__isnull=True)
    run = _guarded(
        run_id,
        "force_cancel",
        event=E.RETIRED,
        actor=actor,
        source=source,
        data={"note": note},
        # Keep an earlier request's who/when: the timeline shows both.
        cancel_requested_at=Coalesce(F("cancel_requested_at"), Now()),
        cancel_requested_by=Case(When(no_request, then=Value(actor)), default=F("cancel_requested_by")),
        cancel_source=Case(When(no_request, then=Value(source)), default=F("cancel_source")),
        cancel_note=Case(When(no_request, then=Value(note)), default=F("cancel_note")),
        **_terminal(S.CANCELLED, R.CANCELLED),
    )
    return run is not None


def _cancel_wins(failed_reason):
    """A failure arriving while a cancel is pending is recorded as cancelled: the stop
    came first. Evaluated inside the UPDATE, so no read can go stale."""
    pending = Q(cancel_requested_at__isnull=False)
    return {
        "status": Case(When(pending, then=Value(S.CANCELLED)), default=Value(S.FAILED)),
        "termination_reason": Case(When(pending, then=Value(R.CANCELLED)), default=Value(failed_reason)),
        "finished_at": Now(),
    }


def reap_stale(*, older_than, limit=500):
    """Settle running runs whose heartbeat is older than `older_than` (a timedelta) as
    failed / worker_lost (retryable). Staleness is re-checked inside each UPDATE, so a
    heartbeat landing at the same moment wins. Returns the ids it settled."""
    cutoff = ExpressionWrapper(Now() - older_than, output_field=DateTimeField())
    stale = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True)
    candidates = Run.objects.filter(stale, status__in=ALLOWED_FROM["reap"])
    reaped = []
    for run_id in candidates.values_list("pk", flat=True)[:limit]:
        run = _guarded(
            run_id,
            "reap",
            event=E.REAPED,
            guard=stale,
            actor="watchdog",
            source=Run.CancelSource.WATCHDOG,
            data={"older_than_s": older_than.total_seconds()},
            **_cancel_wins(R.WORKER_LOST),
        )
        if run is not None:
            log.info("reaped run %s: heartbeat older than %s", run_id, older_than)
            reaped.append(run_id)
    return reaped


# --- suspend, resume, settle ------------------------------------------------------------------


def suspend(run_id, *, worker, status, request=None):
    """Park a running run waiting for input or approval (`request` says what for).
    False when the worker does not hold it or a cancel is pending."""
    if status not in Run.WAITING:
        raise ValueError(f"cannot suspend into {status!r}")
    run = _guarded(
        run_id,
        "suspend",
        event=E.SUSPENDED,
        guard=Q(worker=worker, cancel_requested_at__isnull=True),
        actor=worker,
        data={"request": request},
        status=status,
        pending_request=request,
    )
    return run is not None


def resume(run_id, *, by=None, answer=None, source=Run.CancelSource.USER):
    """Answer a waiting run and set it running again. Claimed once: of two answers
    racing, one returns True; the other changes nothing and returns False. The answer
    is queued as a RunInput for the worker."""
    actor, answer = _actor(by), answer or {}
    with transaction.atomic():
        run = _guarded(
            run_id,
            "resume",
            event=E.RESUMED,
            actor=actor,
            source=source,
            data={"answer": answer},
            status=S.RUNNING,
            pending_request=None,
        )
        if run is None:
            return False
        kind = RunInput.Kind.APPROVAL if "approved" in answer else RunInput.Kind.MESSAGE
        RunInput.objects.create(run=run, kind=kind, payload=answer, created_by=actor)
    return True


def settle(
    run_id,
    *,
    status,
    reason,
    worker=None,
    truncated=False,
    totals=None,
    error_class="",
    error_message="",
):
    """End a live run. Guarded on non-terminal and, with `worker`, on that worker
    holding it. Returns False for a late or duplicate settle, which changes nothing,
    keeps the first outcome, logs one INFO line and writes `late_settle_ignored`."""
    if reason not in Run.REASONS.get(status, ()):
        raise ValueError(f"{reason!r} is not a termination reason for {status!r}")
    if truncated and reason not in Run.TRUNCATING:
        raise ValueError(f"{reason!r} cannot be truncated")
    outcome = _cancel_wins(reason) if status == S.FAILED else _terminal(status, reason)
    changes = {
        **outcome,
        **_totals(totals),
        "truncated": truncated,
        "error_class": (error_class or "")[:200],
        "error_message": safe_message(error_message),
    }
    run = _guarded(
        run_id,
        "settle",
        event=E.SETTLED,
        guard=Q(worker=worker) if worker else None,
        actor=worker or "",
        data={"truncated": truncated, "error_class": changes["error_class"]},
        **changes,
    )
    if run is None:
        _ignore_late_settle(run_id, worker, status, reason)
        return False
    if run.status == S.COMPLETED and run.cancel_requested_at is not None:
        events.append(run.id, E.CANCEL_TOO_LATE, actor=worker or "", source=run.cancel_source)
    return True


def _ignore_late_settle(run_id, worker, status, reason):
    run_id = parse_id(run_id)
    standing = Run.objects.filter(pk=run_id).values("status", "termination_reason", "worker").first()
    if standing is None:
        return
    log.info(
        "late settle ignored: run %s refused %s/%s from worker %r; %s/%s stands",
        run_id, status, reason, worker or "", standing["status"], standing["termination_reason"],
    )
    events.append(
        run_id,
        E.LATE_SETTLE_IGNORED,
        actor=worker or "",
        refused={"status": status, "reason": reason},
        standing={"status": standing["status"], "reason": standing["termination_reason"]},
    )


def _totals(totals):
    if not totals:
        return {}
    unknown = set(totals) - set(TOTALS)
    if unknown:
        raise ValueError(f"unknown totals: {', '.join(sorted(unknown))}")
    clean = {}
    for name, value in totals.items():
        if name == "cost":
            clean[name] = Decimal(str(value))
        elif isinstance(value, int) and value >= 0:
            clean[name] = value
        else:
            raise ValueError(f"total {name} must be a non-negative integer")
    return clean


def safe_message(message):
    """What may be shown to an operator: printable, one paragraph, bounded."""
    text = "".join(ch if ch.isprintable() or ch in "\n\t" else "?" for ch in str(message or ""))
    return text[:ERROR_MESSAGE_LIMIT]


# --- retry, inputs ----------------------------------------------------------------------------


def retry(run_id, *, by=None):
    """Queue a fresh run copying a terminal, retryable one (linked by `retry_of`).
    Once per run: None when it is not retryable or was retried already."""
    run_id = parse_id(run_id)
    if run_id is None:
        return None
    once = Run.objects.filter(
        pk=run_id,
        status__in=Run.TERMINAL,
        termination_reason__in=Run.RETRYABLE,
        retried_at__isnull=True,
    )
    with transaction.atomic():
        if not once.update(retried_at=Now()):
            return None
        original = Run.objects.get(pk=run_id)
        new = create_run(
            agent=original.agent,
            title=original.title,
            input=original.input,
            max_iterations=original.max_iterations,
            token_budget=original.token_budget,
            cost_budget=original.cost_budget,
            retry_of=original,
        )
        events.append(original.id, E.RETRIED, actor=_actor(by), new_run=str(new.id))
    return new


def queue_input(run_id, *, kind, payload, by=None):
    """Queue an operator input for a non-terminal run; None when it has ended."""
    run_id = parse_id(run_id)
    with transaction.atomic():
        live = Run.objects.filter(pk=run_id, status__in=Run.NON_TERMINAL)
        # Lock the run row so a settle cannot slip between the check and the insert and
        # strand the input as queued forever (settle takes the same row in its UPDATE).
        if run_id is None or not live.select_for_update().exists():
            return None
        item = RunInput.objects.create(run_id=run_id, kind=kind, payload=payload, created_by=_actor(by))
        events.append(run_id, E.INPUT_QUEUED, actor=_actor(by), input=item.pk, kind=kind)
    return item


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


# --- async twins, for consumers and the engine --------------------------------------------------

acreate_run = database_sync_to_async(create_run)
aclaim = database_sync_to_async(claim)
aclaim_next = database_sync_to_async(claim_next)
aheartbeat = database_sync_to_async(heartbeat)
arequest_cancel = database_sync_to_async(request_cancel)
aforce_cancel = database_sync_to_async(force_cancel)
areap_stale = database_sync_to_async(reap_stale)
asuspend = database_sync_to_async(suspend)
aresume = database_sync_to_async(resume)
asettle = database_sync_to_async(settle)
aretry = database_sync_to_async(retry)
aqueue_input = database_sync_to_async(queue_input)
aconsume_inputs = database_sync_to_async(consume_inputs)
