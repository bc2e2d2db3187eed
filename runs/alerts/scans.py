"""The alerts that are not timeline events, found by the watchdog's sweep.

    rule              a delivery for …                                     once per
    stuck             each run `rules.stuck` matches (RUNWARDEN_STUCK_S)    run
    waiting_too_long  each run waiting for approval for over threshold_s   wait (its SUSPENDED event)
                      (since its latest SUSPENDED event)
    failure_rate      failed / ended runs in the last window_s over         window (bucket of the
                      failure_rate_pct, with at least min_runs ended        unix time by window_s)

Every age is on the database clock. The dedupe key makes each scan idempotent: many
sweeps, or two watchdogs, write one delivery.
"""

import time
from datetime import timedelta

from django.db.models import Count, Exists, F, OuterRef, Q, Subquery

from runs import rules
from runs.alert_records import AlertDelivery, AlertOn, AlertRule
from runs.alerts.outbox import enqueue
from runs.models import Run, RunEvent

SUSPENDED = RunEvent.objects.filter(run=OuterRef("pk"), kind=RunEvent.Kind.SUSPENDED).order_by("-seq")


def _by_agent(runs, rule):
    return runs.filter(agent=rule.agent) if rule.agent else runs


def _enqueue_new(rule, candidates):
    """Enqueue (run, key, data) for each candidate whose key this rule has not written yet."""
    candidates = list(candidates)
    if not candidates:
        return 0
    known = set(AlertDelivery.objects.filter(rule=rule, dedupe_key__in=[key for _, key, _ in candidates])
                .values_list("dedupe_key", flat=True))
    fresh = [c for c in candidates if c[1] not in known]
    for run, key, data in fresh:
        enqueue([rule], on=rule.on, run=run, key=key, data=data)
    return len(fresh)


def scan_stuck(rule, *, stuck_after, limit):
    # Runs this rule alerted already are left out in SQL, so a crowd of old stuck runs
    # cannot hide a new one behind the limit.
    alerted = Exists(AlertDelivery.objects.filter(rule=rule, run=OuterRef("pk")))
    runs = _by_agent(Run.objects.filter(rules.stuck(stuck_after)), rule).filter(~alerted)
    found = runs.order_by(F("heartbeat_at").asc(nulls_first=True))[:limit]  # the longest silent first
    return _enqueue_new(rule, ((run, f"stuck:{run.id}", {"heartbeat_at": _iso(run.heartbeat_at)}) for run in found))


def scan_waiting(rule, *, limit):
    waiting = Run.objects.filter(status=Run.Status.WAITING_FOR_APPROVAL).annotate(
        waiting_since=Subquery(SUSPENDED.values("at")[:1]), wait_seq=Subquery(SUSPENDED.values("seq")[:1])
    )
    since = rules.stale_before(timedelta(seconds=rule.threshold_s))
    found = _by_agent(waiting.filter(waiting_since__lt=since), rule).order_by("waiting_since")[:limit]
    return _enqueue_new(rule, (
        (run, f"waiting_too_long:{run.id}:{run.wait_seq}",
         {"waiting_since": _iso(run.waiting_since), "threshold_s": rule.threshold_s,
          "tool": (run.pending_request or {}).get("tool", "")})
        for run in found
    ))


def scan_failure_rate(rule, *, now=None):
    ended = _by_agent(Run.objects.filter(
        status__in=Run.TERMINAL, finished_at__gte=rules.stale_before(timedelta(seconds=rule.window_s))
    ), rule)
    counts = ended.aggregate(ended=Count("pk"), failed=Count("pk", filter=Q(status=Run.Status.FAILED)))
    if counts["ended"] < rule.min_runs or counts["failed"] * 100 <= rule.failure_rate_pct * counts["ended"]:
        return 0
    # At most one per window: the key is the window's bucket of unix time.
    bucket = int((time.time() if now is None else now) // rule.window_s)
    data = {**counts, "rate_pct": round(100 * counts["failed"] / counts["ended"], 1),
            "threshold_pct": rule.failure_rate_pct, "window_s": rule.window_s}
    return _enqueue_new(rule, [(None, f"failure_rate:{bucket}", data)])


def scan(*, stuck_after=None, limit=500):
    """Write the deliveries every enabled scanned rule owes now; returns how many."""
    stuck_after = stuck_after if stuck_after is not None else rules.thresholds().stuck
    written = 0
    for rule in AlertRule.objects.filter(
        enabled=True, on__in=[AlertOn.STUCK, AlertOn.WAITING_TOO_LONG, AlertOn.FAILURE_RATE]
    ):
        if rule.on == AlertOn.STUCK:
            written += scan_stuck(rule, stuck_after=stuck_after, limit=limit)
        elif rule.on == AlertOn.WAITING_TOO_LONG:
            written += scan_waiting(rule, limit=limit)
        else:
            written += scan_failure_rate(rule)
    return written


def _iso(value):
    return value.isoformat() if value else None
