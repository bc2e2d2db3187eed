"""Create, claim, heartbeat, suspend and resume."""

from datetime import timedelta
from decimal import Decimal, InvalidOperation

from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Coalesce, Now

from runs import agent_caps, broadcast, messages
from runs.models import Run, RunEvent, RunInput
from runs.transitions._guard import ALLOWED_FROM, E, S, Heartbeat, actor_name, guarded, origin, parse_id, refused, standing
from runs.transitions.outcomes import ClaimOutcome, ResumeOutcome, SuspendOutcome

def create_run(
    *,
    agent,
    title="",
    input=None,
    max_iterations=None,
    token_budget=None,
    cost_budget=None,
    tool_call_budget=None,
    deadline=None,
    retry_of=None,
):
    """Create a queued run and its `created` event. Raises ValueError for bad limits."""
    agent = (agent or "").strip()
    if not agent or len(agent) > 100:
        raise ValueError("agent must be a non-empty name of at most 100 characters")
    for name, value in (
        ("max_iterations", max_iterations), ("token_budget", token_budget), ("tool_call_budget", tool_call_budget),
    ):
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
            tool_call_budget=tool_call_budget,
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
    """Take a queued run for `worker`: CLAIMED, else AGENT_CAPPED (its agent reached a
    24 h cap: it stays queued), NOT_QUEUED (taken, or waiting), ALREADY_TERMINAL or
    NOT_FOUND."""
    capped = agent_caps.capped_agents()
    if _claim(run_id, worker, guard=~Q(agent__in=list(capped)) if capped else None) is not None:
        return ClaimOutcome.CLAIMED
    row = standing(run_id, "agent")
    if row is not None and row["status"] == S.QUEUED and row["agent"] in capped:
        return ClaimOutcome.AGENT_CAPPED
    return refused(row, ClaimOutcome, ClaimOutcome.NOT_QUEUED)


def _claim(run_id, worker, resumed=False, guard=None):
    return guarded(
        run_id,
        "claim",
        event=E.CLAIMED,
        guard=guard,
        actor=worker,
        data={"resumed": True} if resumed else None,
        status=S.RUNNING,
        worker=worker,
        started_at=Coalesce(F("started_at"), Now()),  # a resumed run keeps when it first started
        heartbeat_at=Now(),
    )


def claim_next(*, worker, agents=None):
    """Claim a queued run (of `agents`, if given); None when there is none.

    Answered runs come first (queued again by `resume`; they have a `started_at`),
    oldest start first, then fresh runs, oldest first: an operator who just answered is
    waiting on the first kind, which already holds paid-for work, and each answer
    queues its run once, so fresh runs cannot starve behind them for long.

    On PostgreSQL the candidate is locked with FOR UPDATE SKIP LOCKED so many workers
    claim different runs without waiting on each other; SQLite serialises writers with
    IMMEDIATE transactions instead. Either way the UPDATE re-checks `status = queued`.

    Runs of an agent that reached a 24 h cap are skipped (they stay queued): the capped
    set is read once per call, from a per-process memo (`runs.agent_caps`).
    """
    capped = agent_caps.capped_agents()
    if agents:
        agents = [agent for agent in agents if agent not in capped]
        if not agents:
            return None
    for _ in range(5):
        with transaction.atomic():
            queued = Run.objects.filter(status=S.QUEUED)
            if agents:
                queued = queued.filter(agent__in=list(agents))
            elif capped:
                queued = queued.exclude(agent__in=list(capped))
            resumed = True
            candidate = _first(queued.filter(started_at__isnull=False).order_by("started_at"))
            if candidate is None:
                resumed, candidate = False, _first(queued.order_by("created_at"))
            if candidate is None:
                return None
            run = _claim(candidate, worker, resumed)
            if run is not None:
                return run
    return None


def _first(candidates):
    return candidates.select_for_update(skip_locked=True).values_list("pk", flat=True).first()


def heartbeat(run_id, *, worker):
    """Record that `worker` is alive on the run; answer whether it still holds it and
    whether a cancel is pending (the slow path, for when the fast one is down)."""
    run_id = parse_id(run_id)
    if run_id is None or not worker:  # "" is nobody: a released wait has no holder to beat
        return Heartbeat(held=False, cancel_requested=False)
    beat = Run.objects.filter(pk=run_id, status__in=ALLOWED_FROM["heartbeat"], worker=worker)
    updated = beat.update(heartbeat_at=Now())
    row = Run.objects.filter(pk=run_id).values("status", "worker", "cancel_requested_at", "stop_reason").first()
    if row is None:
        return Heartbeat(held=False, cancel_requested=False)
    held = bool(updated) and row["status"] in Run.LIVE and row["worker"] == worker
    return Heartbeat(
        held=held, cancel_requested=row["cancel_requested_at"] is not None, status=row["status"],
        stop=row["stop_reason"],
    )


def heartbeat_many(run_ids, *, worker):
    """Beat every run of `run_ids` that `worker` holds, in one statement on PostgreSQL
    (an UPDATE inside a CTE, the rows read in the same statement), an UPDATE and one
    SELECT elsewhere. Returns {run_id: Heartbeat} for every id asked about: a run that
    is terminal, held by another worker or unknown comes back not held (unknown: status
    ""). The answer carries pending cancels: the slow path for a whole worker.

    On PostgreSQL a row locked at that instant by another transaction (a step commit, a
    settle, a cancel request) is not waited for: it is answered from the statement's
    snapshot and beaten next interval. Waiting would chain every settle queued behind
    the beat's row locks onto the slowest transaction of any of the worker's runs."""
    ids = {}  # parsed id -> the ids as the caller gave them
    for run_id in run_ids:
        ids.setdefault(parse_id(run_id), []).append(run_id)
    ids.pop(None, None)
    answers = {run_id: Heartbeat(held=False, cancel_requested=False) for run_id in run_ids}
    if not ids or not worker:  # "" is nobody: a released wait has no holder to beat it
        return answers
    if connection.vendor == "postgresql":
        rows = _beat_postgresql(list(ids), worker)
    else:
        rows = _beat_portable(list(ids), worker)
    for pk, status, cancel_requested, held in rows:
        for given in ids[pk]:
            answers[given] = Heartbeat(held=bool(held), cancel_requested=bool(cancel_requested), status=status)
    return answers


def _beat_postgresql(ids, worker):
    table = Run._meta.db_table
    # The outer SELECT reads the statement's snapshot (from before the UPDATE): status,
    # owner and the cancel request as the guard saw them. SKIP LOCKED: see above.
    sql = f"""
        WITH beat AS (
            UPDATE {table} SET heartbeat_at = STATEMENT_TIMESTAMP()
            WHERE id IN (
                SELECT id FROM {table}
                WHERE id = ANY(%(ids)s) AND worker = %(worker)s AND status = ANY(%(live)s)
                FOR UPDATE SKIP LOCKED
            )
            RETURNING id
        )
        SELECT r.id, r.status, r.cancel_requested_at IS NOT NULL,
               beat.id IS NOT NULL OR (r.worker = %(worker)s AND r.status = ANY(%(live)s))
        FROM {table} r LEFT JOIN beat ON beat.id = r.id
        WHERE r.id = ANY(%(ids)s)
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {"ids": ids, "worker": worker, "live": list(ALLOWED_FROM["heartbeat"])})
        return cursor.fetchall()


def _beat_portable(ids, worker):
    live = ALLOWED_FROM["heartbeat"]
    with transaction.atomic():
        Run.objects.filter(pk__in=ids, status__in=live, worker=worker).update(heartbeat_at=Now())
        # Same (IMMEDIATE, on SQLite) transaction: the rows are as the UPDATE left them,
        # so "live and ours" is exactly "beaten".
        rows = Run.objects.filter(pk__in=ids).values_list("pk", "status", "worker", "cancel_requested_at")
        return [(pk, status, requested is not None, status in live and owner == worker)
                for pk, status, owner, requested in rows]


def suspend(run_id, *, worker, status, request=None, release=False, timeout_s=None, charge=None):
    """Park a running run waiting for input or approval (`request` says what for).
    SUSPENDED, else CANCEL_PENDING, NOT_HELD (not running, or another worker's),
    ALREADY_TERMINAL or NOT_FOUND.

    `release=True` (the engine): the worker lets go of the run, so it holds no slot and
    no heartbeat; `request["resume"]` must carry what a worker needs to take it up
    again. `timeout_s` sets `wait_deadline` on the database clock (the watchdog ends
    it there, `expire_waits`); `charge` ({tokens_in, tokens_out, cost}) adds the
    in-flight reply's spend to the totals now, since it was paid for whatever the
    answer. Without `release` (an API agent) the holder keeps the run and its beat."""
    if status not in Run.WAITING:
        raise ValueError(f"cannot suspend into {status!r}")
    changes = {"status": status, "pending_request": request}
    if release:
        changes.update(worker="", heartbeat_at=None)
        if timeout_s is not None:
            changes["wait_deadline"] = ExpressionWrapper(
                Now() + timedelta(seconds=timeout_s), output_field=DateTimeField()
            )
        for name, value in (charge or {}).items():
            changes[name] = F(name) + (Decimal(str(value)) if name == "cost" else int(value))
    shown = {k: v for k, v in (request or {}).items() if k != "resume"} if request else request
    run = guarded(
        run_id,
        "suspend",
        event=E.SUSPENDED,
        guard=Q(worker=worker, cancel_requested_at__isnull=True),
        actor=worker,
        data={"request": shown, **({"released": True, "charged": _jsonable(charge)} if release else {})},
        **changes,
    )
    if run is not None:
        return SuspendOutcome.SUSPENDED
    row = standing(run_id, "worker", "cancel_requested_at")
    if row is not None and row["status"] == S.RUNNING and row["worker"] == worker and row["cancel_requested_at"]:
        return SuspendOutcome.CANCEL_PENDING
    return refused(row, SuspendOutcome, SuspendOutcome.NOT_HELD)


# What an answer is, by the wait it answers: the RunInput kind, and the refusal when
# the run waits for the other thing (an approval is no input, and the reverse).
ANSWERS = {
    S.WAITING_FOR_APPROVAL: (RunInput.Kind.APPROVAL, ResumeOutcome.WAITS_FOR_INPUT),
    S.WAITING_FOR_INPUT: (RunInput.Kind.MESSAGE, ResumeOutcome.WAITS_FOR_APPROVAL),
}


def resume(run_id, *, expect, by=None, answer=None, source=Run.CancelSource.DASHBOARD, client=""):
    """Answer a run waiting for `expect` (WAITING_FOR_APPROVAL or WAITING_FOR_INPUT):
    a run waiting for the other thing is refused (WAITS_FOR_INPUT / _APPROVAL), the
    guard checks it. Claimed once: of two answers racing, one wins; the other changes
    nothing (NOT_WAITING). The answer is queued as a RunInput of the kind `expect` says.

    A run its holder kept (an API agent) is set running again for that holder
    (RESUMED); a run the engine released is queued again, for any worker of its agent
    (REQUEUED; `claim_next` takes it first), keeping `pending_request` for the worker
    that resumes it. ALREADY_TERMINAL or NOT_FOUND otherwise."""
    if expect not in ANSWERS:
        raise ValueError(f"cannot answer a run in {expect!r}")
    kind, other_wait = ANSWERS[expect]
    actor, answer = actor_name(by), answer or {}
    common = {"event": E.RESUMED, "actor": actor, "source": source}
    where = origin(client)
    with transaction.atomic():
        outcome = ResumeOutcome.RESUMED
        run = guarded(
            run_id, "resume", guard=Q(status=expect) & ~Q(worker=""), data={"answer": answer, **where}, **common,
            to_worker=messages.answered,  # its holder (an API agent) fetches the answer
            status=S.RUNNING, pending_request=None,
        )
        if run is None:
            outcome = ResumeOutcome.REQUEUED
            run = guarded(
                run_id, "resume", guard=Q(status=expect, worker=""), data={"answer": answer, "requeued": True, **where},
                **common, status=S.QUEUED, wait_deadline=None,
            )
        if run is None:
            row = standing(run_id)
            waits_otherwise = row is not None and row["status"] in Run.WAITING and row["status"] != expect
            return refused(row, ResumeOutcome, other_wait if waits_otherwise else ResumeOutcome.NOT_WAITING)
        RunInput.objects.create(run=run, kind=kind, payload=answer, created_by=actor)
    return outcome


def _jsonable(charge):
    return {k: str(v) for k, v in charge.items()} if charge else None
