"""The ways out: request cancel (abort), retire, reap, settle."""

from decimal import Decimal

from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Coalesce, Now

from runs import events, messages, rules
from runs.models import Run
from runs.transitions._guard import (
    ALLOWED_FROM, UNHELD, E, R, S, actor_name, cancel_wins, guarded, log, origin, parse_id, refused, standing, stopped_or,
    terminal,
)
from runs.transitions.outcomes import CancelOutcome, RetireOutcome, SettleOutcome
from runs.transitions.stopping import ENDINGS as STOP_ENDINGS

TOTALS = ("tokens_in", "tokens_out", "cost", "steps", "tool_calls")
ERROR_MESSAGE_LIMIT = 2000


def request_cancel(run_id, *, by=None, source=Run.CancelSource.DASHBOARD, note="", client=""):
    """Ask a run to stop. A run nobody holds (queued, or waiting and released by the
    engine) is cancelled at once (SETTLED); a held one is flagged and its worker
    signalled (REQUESTED); asking twice is ALREADY_REQUESTED.

    One guarded UPDATE decides both cases (a CASE on the status it finds), with its
    event, in one transaction: only a refused request reads the row again, to say why.
    """
    if source not in Run.CancelSource.values:
        raise ValueError(f"unknown cancel source {source!r}")
    actor, note = actor_name(by), (note or "")[:rules.NOTE_LIMIT]
    queued = UNHELD  # a queued run, or a waiting one the engine released

    def if_queued(then, otherwise):
        # SET expressions see the row as it was, so every CASE tests the old status.
        return Case(When(queued, then=then), default=otherwise)

    run = guarded(
        run_id,
        "request_cancel",
        # Nobody holds a queued or released run: settle it now. A held one is flagged once.
        guard=queued | Q(cancel_requested_at__isnull=True),
        event=E.CANCEL_REQUESTED,
        actor=actor,
        source=source,
        data=lambda run: {"note": note, **origin(client), **({"settled_queued": True} if run.is_terminal else {})},
        to_worker=lambda run: None if run.is_terminal else messages.cancel(run),  # settled: nobody to tell
        cancel_requested_at=Now(),
        cancel_requested_by=actor,
        cancel_source=source,
        cancel_note=note,
        status=if_queued(Value(S.CANCELLED), F("status")),
        termination_reason=if_queued(Value(R.CANCELLED), F("termination_reason")),
        finished_at=if_queued(Now(), F("finished_at")),
    )
    if run is not None:
        return CancelOutcome.SETTLED if run.is_terminal else CancelOutcome.REQUESTED
    return refused(standing(run_id), CancelOutcome, CancelOutcome.ALREADY_REQUESTED)


def retire(run_id, *, by=None, note="", source=Run.CancelSource.DASHBOARD, guard=None, client=""):
    """End a run whose worker is gone (or ignores an abort), without that worker: any
    non-terminal run becomes cancelled now (a run a guardrail asked to stop ends as that
    stop says: completed/budget_exhausted or failed/policy_denied); its late settle then
    loses. The totals it reached are kept. RETIRED, or ALREADY_TERMINAL / NOT_FOUND, or NOT_DUE when
    `guard` (a Q re-checked inside the UPDATE, e.g. "still silent") no longer holds."""
    actor, note = actor_name(by), (note or "")[:rules.NOTE_LIMIT]
    no_request = Q(cancel_requested_at__isnull=True)
    run = guarded(
        run_id,
        "retire",
        event=E.RETIRED,
        guard=guard,
        to_worker=messages.cancel,  # a worker still alive must stop
        actor=actor,
        source=source,
        data={"note": note, **origin(client)},
        # Keep an earlier request's who/when: the timeline shows both.
        cancel_requested_at=Coalesce(F("cancel_requested_at"), Now()),
        cancel_requested_by=Case(When(no_request, then=Value(actor)), default=F("cancel_requested_by")),
        cancel_source=Case(When(no_request, then=Value(source)), default=F("cancel_source")),
        cancel_note=Case(When(no_request, then=Value(note)), default=F("cancel_note")),
        **stopped_or(S.CANCELLED, R.CANCELLED),
    )
    if run is not None:
        return RetireOutcome.RETIRED
    return refused(standing(run_id), RetireOutcome, RetireOutcome.NOT_DUE)


def reap_stale(*, older_than, limit=500):
    """Settle running runs whose heartbeat is older than `older_than` (a timedelta) as
    failed / worker_lost (retryable). Staleness is re-checked inside each UPDATE, so a
    heartbeat landing at the same moment wins. Returns the ids it settled."""
    stale = rules.silent(older_than)
    candidates = Run.objects.filter(stale, status__in=ALLOWED_FROM["reap"])
    reaped = []
    for run_id in candidates.values_list("pk", flat=True)[:limit]:
        run = guarded(
            run_id,
            "reap",
            event=E.REAPED,
            guard=stale,
            actor="watchdog",
            source=Run.CancelSource.WATCHDOG,
            data={"older_than_s": older_than.total_seconds()},
            **cancel_wins(R.WORKER_LOST),
        )
        if run is not None:
            log.info("reaped run %s: heartbeat older than %s", run_id, older_than)
            reaped.append(run_id)
    return reaped


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
    """End a live run. Guarded on live and, with `worker`, on that worker holding it.
    SETTLED (as asked) or CANCEL_WON (a failure while a cancel is pending is recorded
    cancelled/cancelled), or STOPPED: a guardrail's stop was pending, and a cancelled or
    failed settle is recorded as that stop's ending (completed/budget_exhausted,
    truncated, or failed/policy_denied). A late or duplicate settle changes nothing, keeps the first
    outcome, logs one INFO line and writes `late_settle_ignored`: ALREADY_TERMINAL, or
    NOT_HELD (queued, or another worker holds it); NOT_FOUND for no such run."""
    if reason not in Run.REASONS.get(status, ()):
        raise ValueError(f"{reason!r} is not a termination reason for {status!r}")
    if truncated and reason not in Run.TRUNCATING:
        raise ValueError(f"{reason!r} cannot be truncated")
    held = Q(worker=worker) if worker else Q()
    details = {**_totals(totals), "error_class": (error_class or "")[:200], "error_message": safe_message(error_message)}

    def attempt(guard, outcome):
        return guarded(
            run_id,
            "settle",
            event=E.SETTLED,
            guard=held & guard,
            actor=worker or "",
            data=lambda run: {"truncated": run.truncated, "error_class": details["error_class"]},
            **outcome,
            **details,
        )

    if status == S.CANCELLED:
        # The settle of every abort: plain values (no CASE to compile on the operator's
        # wait). A guardrail's stop pending instead makes this guard lose; then the run
        # is settled with that stop's own ending, guarded on the same stop.
        run = attempt(Q(stop_reason=""), {**terminal(status, reason), "truncated": False})
        if run is None:
            row = standing(run_id, "stop_reason")
            if row is not None and row["status"] in Run.LIVE and row["stop_reason"] in STOP_ENDINGS:
                stopped, cut = STOP_ENDINGS[row["stop_reason"]]
                run = attempt(Q(stop_reason=row["stop_reason"]), {**terminal(stopped, row["stop_reason"]),
                                                                  "truncated": cut})
    elif status == S.COMPLETED:
        run = attempt(Q(), {**terminal(status, reason), "truncated": truncated})
    else:  # a failure: a pending request's ending wins (stopped_or)
        run = attempt(Q(), stopped_or(status, reason))
    if run is None:
        return _ignore_late_settle(run_id, worker, status, reason)
    honoured = run.stop_reason and run.termination_reason == run.stop_reason
    if run.status == S.COMPLETED and run.cancel_requested_at is not None and not honoured:
        events.append(run.id, E.CANCEL_TOO_LATE, actor=worker or "", source=run.cancel_source)
    if run.stop_reason and (run.status, run.termination_reason) != (status, reason):
        return SettleOutcome.STOPPED
    return SettleOutcome.CANCEL_WON if run.status != status else SettleOutcome.SETTLED


def _ignore_late_settle(run_id, worker, status, reason):
    run_id = parse_id(run_id)
    row = standing(run_id, "termination_reason", "worker")
    outcome = refused(row, SettleOutcome, SettleOutcome.NOT_HELD)
    if row is None:
        return outcome
    log.info(
        "late settle ignored: run %s refused %s/%s from worker %r; %s/%s stands",
        run_id, status, reason, worker or "", row["status"], row["termination_reason"],
    )
    events.append(
        run_id,
        E.LATE_SETTLE_IGNORED,
        actor=worker or "",
        refused={"status": status, "reason": reason},
        standing={"status": row["status"], "reason": row["termination_reason"]},
    )
    return outcome


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
