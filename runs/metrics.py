"""Prometheus metrics, read from the database at scrape time.

Counts come from the rows themselves (runs, timeline events), so every server reports
the same truth however many processes there are. Only `runwarden_open_websockets` is
per process: it counts this process's sockets.
"""

from datetime import timedelta

from django.db.models import Count, DurationField, Exists, ExpressionWrapper, F, OuterRef, Q, Sum
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from runs import rules
from runs.models import AlertDelivery, Run, RunEvent

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CANCEL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

_process = CollectorRegistry(auto_describe=True)
OPEN_WEBSOCKETS = Gauge(
    "runwarden_open_websockets", "WebSockets open on this server process", ["kind"], registry=_process
)


# Which cancels a latency figure is about. Only `live` measures the product's promise
# (a worker noticed and stopped); a queued run is cancelled in the request's own
# statement (0 ms) and a retire does not wait for anyone, so mixing them in flatters.
CANCEL_KINDS = ("live", "queued", "retired")


def _cancel_kind(kind):
    retired = Exists(RunEvent.objects.filter(run=OuterRef("pk"), kind=RunEvent.Kind.RETIRED))
    # Nobody held it (queued, or a wait the engine released): the request settled it.
    unheld = Q(started_at__isnull=True) | Q(Exists(RunEvent.objects.filter(
        run=OuterRef("pk"), kind=RunEvent.Kind.CANCEL_REQUESTED, data__settled_queued=True
    )))
    if kind == "queued":
        return unheld
    if kind == "retired":
        return ~unheld & Q(retired)
    return ~unheld & ~Q(retired)


def cancel_latency_buckets(*, since=None, kind="live"):
    """(cumulative counts per bucket incl. +Inf, sum in seconds) of request → settled
    for the cancelled runs of `kind` (see CANCEL_KINDS) that had a request (created
    since `since`, if given); one aggregate query."""
    latency = ExpressionWrapper(F("finished_at") - F("cancel_requested_at"), output_field=DurationField())
    cancelled = Run.objects.filter(
        _cancel_kind(kind), status=Run.Status.CANCELLED, cancel_requested_at__isnull=False, finished_at__isnull=False
    ).annotate(latency=latency)
    if since is not None:
        cancelled = cancelled.filter(created_at__gte=since)
    aggregates = {
        f"le{i}": Count("pk", filter=Q(latency__lte=timedelta(seconds=bound)))
        for i, bound in enumerate(CANCEL_BUCKETS_S)
    }
    row = cancelled.aggregate(total=Count("pk"), latency_sum=Sum("latency"), **aggregates)
    counts = [row[f"le{i}"] for i in range(len(CANCEL_BUCKETS_S))] + [row["total"]]
    total = row["latency_sum"] or timedelta(0)
    return counts, total.total_seconds()


def cancel_counts(*, since=None):
    """{kind: number of cancelled runs with a request}, for each of CANCEL_KINDS; one query."""
    cancelled = Run.objects.filter(status=Run.Status.CANCELLED, cancel_requested_at__isnull=False)
    if since is not None:
        cancelled = cancelled.filter(created_at__gte=since)
    return cancelled.aggregate(**{kind: Count("pk", filter=_cancel_kind(kind)) for kind in CANCEL_KINDS})


class RunCollector:
    def collect(self):
        by_outcome = GaugeMetricFamily(
            "runwarden_runs", "Runs by status and termination reason", labels=["status", "reason"]
        )
        for row in Run.objects.order_by().values("status", "termination_reason").annotate(n=Count("pk")):
            by_outcome.add_metric([row["status"], row["termination_reason"]], row["n"])
        yield by_outcome

        yield GaugeMetricFamily(
            "runwarden_active_runs", "Runs running or waiting", value=Run.objects.filter(status__in=Run.LIVE).count()
        )
        yield GaugeMetricFamily(
            "runwarden_stuck_runs", "Live runs with a stale heartbeat", value=Run.objects.filter(rules.stuck()).count()
        )
        events = dict(
            RunEvent.objects.filter(kind__in=["late_settle_ignored", "reaped", "cancel_not_honoured"])
            .order_by().values_list("kind").annotate(n=Count("pk"))
        )
        yield CounterMetricFamily(
            "runwarden_late_settles_ignored", "Settles refused because the run had ended",
            value=events.get("late_settle_ignored", 0),
        )
        yield CounterMetricFamily(
            "runwarden_reaped_runs", "Runs settled failed / worker_lost by the watchdog",
            value=events.get("reaped", 0),
        )
        yield CounterMetricFamily(
            "runwarden_cancels_not_honoured",
            "Cancels still not honoured after RUNWARDEN_CANCEL_GRACE_S (the worker was told to stop hard)",
            value=events.get("cancel_not_honoured", 0),
        )
        alerts = dict(AlertDelivery.objects.order_by().values_list("status").annotate(n=Count("pk")))
        by_status = GaugeMetricFamily(
            "runwarden_alerts", "Alert deliveries by status: sent, pending (not yet, retrying), failed (gave up)",
            labels=["status"],
        )
        for status in AlertDelivery.Status.values:
            by_status.add_metric([status], alerts.get(status, 0))
        yield by_status
        histogram = HistogramMetricFamily(
            "runwarden_cancel_latency_seconds",
            "Cancel request to cancelled settle; kind: live (a worker stopped), queued (settled by the request), retired",
            labels=["kind"],
        )
        bounds = [str(float(b)) for b in CANCEL_BUCKETS_S] + ["+Inf"]
        for kind in CANCEL_KINDS:
            counts, total = cancel_latency_buckets(kind=kind)
            histogram.add_metric([kind], buckets=list(zip(bounds, counts)), sum_value=total)
        yield histogram


def render():
    """The exposition text for one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector())
    return generate_latest(registry) + generate_latest(_process)
