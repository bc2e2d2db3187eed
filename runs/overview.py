"""The overview's numbers over a window (1 h, 24 h, 7 d), for its charts (read-only,
on indexes: every query is a range on `created_at`).

One grouped query per window feeds the per-bucket charts (status and ending reason
over time) and the totals. It groups by minute (1 h) or hour (longer windows) in the
database and folds into the window's buckets here, so the database returns a few
thousand rows at most. A window's numbers are memoised for a fraction of a bucket
(`Window.ttl_s`): fifty viewers of the 7-day page do not rescan a week of runs each.
"""

import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from runs import metrics
from runs.models import Run


@dataclass(frozen=True)
class Window:
    key: str
    label: str
    span: timedelta
    bucket: timedelta
    trunc: type  # the database truncation the buckets are folded from
    ttl_s: float
    per: str  # "per <per>" under the charts


WINDOWS = {
    w.key: w
    for w in (
        Window("1h", "Last hour", timedelta(hours=1), timedelta(minutes=5), TruncMinute, 5.0, "5 minutes"),
        Window("24h", "Last 24 hours", timedelta(hours=24), timedelta(hours=1), TruncHour, 30.0, "hour"),
        Window("7d", "Last 7 days", timedelta(days=7), timedelta(hours=6), TruncHour, 120.0, "6 hours"),
    )
}
DEFAULT_WINDOW = "24h"
WINDOW = WINDOWS[DEFAULT_WINDOW].span  # kept for callers of last_24h


@dataclass(frozen=True)
class Overview:
    window: Window
    since: object
    buckets: list  # [(bucket start, {status: n}, {reason: n})], oldest first
    reasons: list  # [(reason, n)] for runs that ended, most first
    statuses: list  # [(status, n)]
    latency: list  # [(upper bound label, n in this bucket)] (not cumulative), live runs only
    latency_count: int
    settled_at_once: dict  # {"queued": n, "retired": n}: cancels no worker had to notice

    @property
    def hours(self):
        """[(bucket start, {status: n})] (the 24-hour page's per-hour chart)."""
        return [(start, by_status) for start, by_status, _ in self.buckets]


_memo = {}


def for_window(key=DEFAULT_WINDOW, now=None, *, fresh=False):
    """The numbers of window `key` (unknown keys: the default), memoised for its ttl."""
    window = WINDOWS.get(key) or WINDOWS[DEFAULT_WINDOW]
    at = time.monotonic()
    hit = _memo.get(window.key)
    if not fresh and now is None and hit is not None and at - hit[0] < window.ttl_s:
        return hit[1]
    value = _compute(window, now or timezone.now())
    if now is None:
        _memo[window.key] = (at, value)
    return value


def last_24h(now=None):
    return for_window("24h", now, fresh=True)


def _floor(instant, bucket):
    """The start of the bucket holding `instant` (buckets aligned on UTC midnight)."""
    midnight = instant.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight + bucket * ((instant - midnight) // bucket)


def _compute(window, now):
    since = now - window.span
    count = round(window.span / window.bucket)
    last = _floor(now, window.bucket)
    starts = [last - window.bucket * i for i in range(count - 1, -1, -1)]
    buckets = {start: ({}, {}) for start in starts}
    statuses, reasons = Counter(), Counter()
    recent = Run.objects.filter(created_at__gte=since).order_by()
    grouped = recent.annotate(at=window.trunc("created_at")).values_list("at", "status", "termination_reason")
    for at, status, reason, n in grouped.annotate(n=Count("pk")):
        by_status, by_reason = buckets.setdefault(_floor(at, window.bucket), ({}, {}))
        by_status[status] = by_status.get(status, 0) + n
        statuses[status] += n
        if status in Run.TERMINAL:
            by_reason[reason] = by_reason.get(reason, 0) + n
            reasons[reason] += n
    cumulative, _ = metrics.cancel_latency_buckets(since=since)
    labels = [_seconds_label(b) for b in metrics.CANCEL_BUCKETS_S] + ["more"]
    per_bucket = [c - (cumulative[i - 1] if i else 0) for i, c in enumerate(cumulative)]
    return Overview(
        window=window,
        since=since,
        buckets=[(start, *buckets[start]) for start in sorted(buckets)][-count:],
        reasons=reasons.most_common(),
        statuses=[(s, statuses.get(s, 0)) for s in Run.Status.values],
        latency=list(zip(labels, per_bucket)),
        latency_count=cumulative[-1],
        settled_at_once={k: n for k, n in metrics.cancel_counts(since=since).items() if k != "live"},
    )


def _seconds_label(bound):
    return f"≤{bound * 1000:g} ms" if bound < 1 else f"≤{bound:g} s"
