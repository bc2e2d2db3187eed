"""The last 24 hours in numbers, for the overview charts (read-only, on indexes:
every query is a range on `created_at`)."""

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count
from django.db.models.functions import TruncHour
from django.utils import timezone

from runs import metrics
from runs.models import Run

WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class Overview:
    since: object
    hours: list  # [(hour start, {status: n})], oldest first, 24 entries
    reasons: list  # [(reason, n)] for runs that ended, most first
    statuses: list  # [(status, n)]
    latency: list  # [(upper bound label, n in this bucket)] (not cumulative), live runs only
    latency_count: int
    settled_at_once: dict  # {"queued": n, "retired": n}: cancels no worker had to notice


def last_24h(now=None):
    now = now or timezone.now()
    since = now - WINDOW
    recent = Run.objects.filter(created_at__gte=since).order_by()
    start = since.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    hours = {start + timedelta(hours=i): {} for i in range(-1, 24)}
    statuses, reasons = Counter(), Counter()
    # One pass over the window (a range on the created_at index) feeds all three charts.
    grouped = recent.annotate(hour=TruncHour("created_at")).values_list("hour", "status", "termination_reason")
    for hour, status, reason, n in grouped.annotate(n=Count("pk")):
        by_status = hours.setdefault(hour, {})
        by_status[status] = by_status.get(status, 0) + n
        statuses[status] += n
        if status in Run.TERMINAL:
            reasons[reason] += n
    cumulative, _ = metrics.cancel_latency_buckets(since=since)
    labels = [_seconds_label(b) for b in metrics.CANCEL_BUCKETS_S] + ["more"]
    per_bucket = [c - (cumulative[i - 1] if i else 0) for i, c in enumerate(cumulative)]
    return Overview(
        since=since,
        hours=sorted(hours.items())[-24:],
        reasons=reasons.most_common(),
        statuses=[(s, statuses.get(s, 0)) for s in Run.Status.values],
        latency=list(zip(labels, per_bucket)),
        latency_count=cumulative[-1],
        settled_at_once={k: n for k, n in metrics.cancel_counts(since=since).items() if k != "live"},
    )


def _seconds_label(bound):
    return f"≤{bound * 1000:g} ms" if bound < 1 else f"≤{bound:g} s"
