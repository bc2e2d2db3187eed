"""Read-only questions about runs, shared by the CLI, the admin and the dashboard."""

from django.db import connection
from django.db.models import DateTimeField, ExpressionWrapper, Q
from django.db.models.functions import Now

from runs.models import Run


def stale_before(older_than):
    """The database clock minus `older_than`: every node compares against one clock."""
    return ExpressionWrapper(Now() - older_than, output_field=DateTimeField())


# Waiting with no holder: the engine released it. It has no heartbeat to go stale and
# is never stuck nor lost; only its wait deadline ends it (`transitions.expire_waits`).
RELEASED = Q(status__in=Run.WAITING, worker="")


def stuck(older_than):
    """Held live runs whose heartbeat is older than `older_than`, oldest heartbeat first."""
    cutoff = stale_before(older_than)
    return Run.objects.filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True), status__in=Run.LIVE
    ).exclude(RELEASED).order_by("heartbeat_at")


def cancel_not_honoured(grace):
    """Live runs whose cancel was requested more than `grace` ago."""
    return Run.objects.filter(status__in=Run.LIVE, cancel_requested_at__lt=stale_before(grace))


def escalation_due(grace):
    """Live runs whose cancel is older than `grace` and not escalated yet."""
    return cancel_not_honoured(grace).filter(cancel_escalated_at__isnull=True)


def retire_due(escalate):
    """Live runs told to stop hard more than `escalate` ago and still not ended."""
    return Run.objects.filter(status__in=Run.LIVE, cancel_escalated_at__lt=stale_before(escalate))


def past_deadline():
    """Non-terminal runs past their deadline that nobody has asked to stop yet."""
    return Run.objects.filter(
        status__in=Run.NON_TERMINAL, deadline__lt=Now(), cancel_requested_at__isnull=True
    )


def estimated_runs():
    """The planner's estimate of the number of runs (PostgreSQL), free to ask; None
    where there is no cheap estimate (SQLite, or a table never analysed)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = 'runs_run'::regclass")
        estimate = cursor.fetchone()[0]
    return estimate if estimate >= 0 else None
