"""Read-only questions about runs that are not rules (those are `runs.rules`)."""

from django.db import connection

from runs import rules
from runs.models import Run


def stuck(older_than=None):
    """Stuck runs (`rules.stuck`), oldest heartbeat first: the CLI's, triage's and the
    list's order."""
    return Run.objects.filter(rules.stuck(older_than)).order_by("heartbeat_at")


def estimated_runs():
    """The planner's estimate of the number of runs (PostgreSQL), free to ask; None
    where there is no cheap estimate (SQLite, or a table never analysed)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = 'runs_run'::regclass")
        estimate = cursor.fetchone()[0]
    return estimate if estimate >= 0 else None
