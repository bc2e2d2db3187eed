"""The run predicates and their thresholds: one home, on the database clock.

Every "is this run stuck / aborting / retryable / …" question is asked here, as a `Q`
the database evaluates against its own `Now()`, so the list, the run page, triage,
metrics, the watchdog and the engine agree whatever the web servers' and workers'
clocks say. The thresholds are read from settings here and nowhere else.

    rule            a run that is …                                          threshold
    stuck           live and held, heartbeat older than the threshold (or     RUNWARDEN_STUCK_S
                    none); a wait the engine released has no heartbeat and
                    is never stuck
    lost            running, heartbeat older than the reap threshold          RUNWARDEN_REAP_S
    aborting        not ended, a cancel asked ("Aborting…")                  —
    not honoured    live, its cancel older than the grace                     RUNWARDEN_CANCEL_GRACE_S
    escalation due  not honoured and not told to stop hard yet                RUNWARDEN_CANCEL_GRACE_S
    retire due      live, told to stop hard longer ago than the threshold     RUNWARDEN_CANCEL_ESCALATE_S
    deadline passed not ended, past `deadline`, nobody asked it to stop yet   —
    retryable       ended failed for a retryable reason, not retried yet      —
    stalled         running, heartbeating, no cancel asked, started over T    RUNWARDEN_NO_PROGRESS_S, or
                    ago, not flagged no_progress yet; then, annotated by      the agent's no_progress_s
                    `with_last_progress`, `no_progress_for(T)`: nothing new
                    for T (runs.loops.flag_stalled)

A queryset passed through `with_flags` carries `flag_stuck` and `flag_not_honoured`
computed by the same query; `is_stuck(run)` / `is_not_honoured(run)` read them (and ask
the database once for a run fetched without them), so a page never judges on its own
clock.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import BooleanField, Case, DateTimeField, Exists, ExpressionWrapper, F, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Coalesce, Greatest, Now

from runs.models import ApiInflight, Run, RunEvent

# An operator's note (abort, retire, bulk): the column's length, so a form, the API and a
# transition cut or refuse at the same place.
NOTE_LIMIT = Run._meta.get_field("cancel_note").max_length
# What a deadline cancel says, whoever notices first (the watchdog or the run's worker).
DEADLINE_NOTE = "deadline passed"


@dataclass(frozen=True)
class Thresholds:
    stuck: timedelta
    reap: timedelta
    grace: timedelta
    escalate: timedelta


def thresholds(*, stuck_s=None, reap_s=None, grace_s=None, escalate_s=None):
    """The thresholds from settings (read at each call: tests and settings overrides
    change them), each replaceable by an explicit number of seconds."""

    def pick(value, name):
        return timedelta(seconds=value if value is not None else getattr(settings, name))

    return Thresholds(
        stuck=pick(stuck_s, "RUNWARDEN_STUCK_S"),
        reap=pick(reap_s, "RUNWARDEN_REAP_S"),
        grace=pick(grace_s, "RUNWARDEN_CANCEL_GRACE_S"),
        escalate=pick(escalate_s, "RUNWARDEN_CANCEL_ESCALATE_S"),
    )


def stale_before(older_than):
    """The database clock minus `older_than`: every node compares against one clock."""
    return ExpressionWrapper(Now() - older_than, output_field=DateTimeField())


# Waiting with no holder: the engine released it. It has no heartbeat to go stale and
# is never stuck nor lost; only its wait deadline ends it (`transitions.expire_waits`).
RELEASED = Q(status__in=Run.WAITING, worker="")
ABORTING = Q(status__in=Run.NON_TERMINAL, cancel_requested_at__isnull=False)
RETRYABLE = Q(status__in=Run.TERMINAL, termination_reason__in=Run.RETRYABLE, retried_at__isnull=True)
DEADLINE_PASSED = Q(status__in=Run.NON_TERMINAL, deadline__lt=Now(), cancel_requested_at__isnull=True)


def silent(older_than=None):
    """No heartbeat for longer than `older_than` (default: the stuck threshold), or none."""
    older_than = older_than if older_than is not None else thresholds().stuck
    return Q(heartbeat_at__lt=stale_before(older_than)) | Q(heartbeat_at__isnull=True)


def stuck(older_than=None):
    """Held live runs whose heartbeat is older than `older_than` (default RUNWARDEN_STUCK_S)."""
    return Q(status__in=Run.LIVE) & silent(older_than) & ~RELEASED


def lost(older_than=None):
    """Running runs whose heartbeat is older than `older_than` (default RUNWARDEN_REAP_S)."""
    older_than = older_than if older_than is not None else thresholds().reap
    return Q(status=Run.Status.RUNNING) & silent(older_than)


def not_honoured(grace=None):
    """Live runs whose cancel was asked more than `grace` (RUNWARDEN_CANCEL_GRACE_S) ago."""
    grace = grace if grace is not None else thresholds().grace
    return Q(status__in=Run.LIVE, cancel_requested_at__lt=stale_before(grace))


def escalation_due(grace=None):
    """Not honoured, and the worker not told to stop hard yet."""
    return not_honoured(grace) & Q(cancel_escalated_at__isnull=True)


def retire_due(escalate=None):
    """Live runs told to stop hard more than `escalate` (RUNWARDEN_CANCEL_ESCALATE_S) ago."""
    escalate = escalate if escalate is not None else thresholds().escalate
    return Q(status__in=Run.LIVE, cancel_escalated_at__lt=stale_before(escalate))


# What counts as progress the server sees. Streamed tokens of an engine run live only on
# the channel layer; the database has its committed and discarded steps (a discard is
# spend the provider charged: the model did answer), its claims and resumes (a run
# taken up again starts afresh), and, for an API agent, the streamed text it keeps of
# the step in flight (ApiInflight, saved with each batch of events).
PROGRESS_KINDS = (RunEvent.Kind.STEP_COMMITTED, RunEvent.Kind.STEP_DISCARDED, RunEvent.Kind.CLAIMED,
                  RunEvent.Kind.RESUMED)


def stalled(no_progress_s):
    """The cheap part of "no progress for T": running, heartbeating (not stuck), no
    cancel or stop asked, started more than T ago, not flagged no_progress yet. Annotate
    with `with_last_progress` and filter `no_progress_for(T)` for the rest."""
    flagged = RunEvent.objects.filter(run=OuterRef("pk"), kind=RunEvent.Kind.FLAGGED, data__flag="no_progress")
    return (
        Q(status=Run.Status.RUNNING, cancel_requested_at__isnull=True, started_at__lt=stale_before(
            timedelta(seconds=no_progress_s)))
        & ~silent() & ~Exists(flagged)
    )


def with_last_progress(runs):
    """`runs` annotated with `last_progress`: the newest of its progress events, its
    API in-flight text, and its start. Event and in-flight times are stamped by the
    writing process's clock; against T (minutes) a node's skew is noise."""
    last_event = (RunEvent.objects.filter(run=OuterRef("pk"), kind__in=PROGRESS_KINDS)
                  .order_by("-seq").values("at")[:1])
    inflight = ApiInflight.objects.filter(run=OuterRef("pk")).values("updated_at")[:1]
    # Coalesce each with started_at: SQLite's MAX() of a NULL is NULL.
    return runs.annotate(last_progress=Greatest(
        Coalesce(Subquery(last_event), F("started_at")), Coalesce(Subquery(inflight), F("started_at")),
    ))


def no_progress_for(no_progress_s):
    """After `with_last_progress`: its last progress is older than T, on the database clock."""
    return Q(last_progress__lt=stale_before(timedelta(seconds=no_progress_s)))


def with_flags(runs):
    """`runs` annotated with `flag_stuck` and `flag_not_honoured`, on the database clock."""
    # CASE, not the bare condition: SQL's NULL (no cancel asked) must read as False.
    return runs.annotate(
        flag_stuck=Case(When(stuck(), then=Value(True)), default=Value(False), output_field=BooleanField()),
        flag_not_honoured=Case(
            When(not_honoured(), then=Value(True)), default=Value(False), output_field=BooleanField()
        ),
    )


def is_stuck(run):
    """`stuck()` for one run object: its `flag_stuck` if it came through `with_flags`,
    else one query (remembered on the object)."""
    return _flag(run, "flag_stuck", stuck)


def is_not_honoured(run):
    """`not_honoured()` for one run object, as `is_stuck`."""
    return _flag(run, "flag_not_honoured", not_honoured)


def _flag(run, name, rule):
    value = getattr(run, name, None)
    if value is None:  # fetched without `with_flags`
        value = Run.objects.filter(rule(), pk=run.pk).exists()
        setattr(run, name, value)
    return bool(value)
