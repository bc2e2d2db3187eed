"""The watchdog: finds runs nobody is looking after and settles them, each guarded.

Every sweep, on the database clock (one clock for every node):

    finding               rule                                             action
    stuck                 live, heartbeat older than RUNWARDEN_STUCK_S     flagged (derived, counted)
    lost                  running, heartbeat older than RUNWARDEN_REAP_S   reap: failed / worker_lost
    unanswered wait       released waiting_*, past its wait_deadline       failed / approval_denied
    past deadline         non-terminal, deadline passed, no cancel yet     request cancel (watchdog)
    cancel not honoured   cancel older than RUNWARDEN_CANCEL_GRACE_S       escalate: the worker is told
                                                                           to stop hard (once)
    hard stop ignored     escalated over RUNWARDEN_CANCEL_ESCALATE_S ago   retire
    ignored and silent    not honoured, heartbeat stale as well            retire at once

A waiting run the engine released holds no heartbeat: it is never stuck nor reaped,
only ended at its wait deadline (`approval_timeout_s`). Staleness is re-checked inside each UPDATE, so a heartbeat landing at the same moment
wins. A sweep is idempotent: two watchdogs (or two servers) can run side by side.
"""

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Q

from runs import queries, transitions
from runs.models import Run

log = logging.getLogger(__name__)
WATCHDOG = Run.CancelSource.WATCHDOG


@dataclass
class Sweep:
    stuck: int = 0
    not_honoured: int = 0
    reaped: list = field(default_factory=list)
    deadline_cancelled: list = field(default_factory=list)
    retired: list = field(default_factory=list)
    escalated: list = field(default_factory=list)
    expired: list = field(default_factory=list)  # waits nobody answered in time

    @property
    def acted(self):
        return bool(self.reaped or self.deadline_cancelled or self.retired or self.escalated or self.expired)


def _seconds(value):
    return timedelta(seconds=value)


def sweep(*, stuck_s=None, reap_s=None, grace_s=None, escalate_s=None, limit=500):
    """One pass of the table above; returns what it found and did."""
    stuck_after = _seconds(stuck_s if stuck_s is not None else settings.RUNWARDEN_STUCK_S)
    reap_after = _seconds(reap_s if reap_s is not None else settings.RUNWARDEN_REAP_S)
    grace_s = grace_s if grace_s is not None else settings.RUNWARDEN_CANCEL_GRACE_S
    grace = _seconds(grace_s)
    escalate = _seconds(escalate_s if escalate_s is not None else settings.RUNWARDEN_CANCEL_ESCALATE_S)
    report = Sweep()

    for run_id in queries.past_deadline().values_list("pk", flat=True)[:limit]:
        outcome = transitions.request_cancel(run_id, by="watchdog", source=WATCHDOG, note="deadline exceeded")
        if outcome in (transitions.CancelOutcome.REQUESTED, transitions.CancelOutcome.SETTLED):
            report.deadline_cancelled.append(run_id)

    report.reaped = transitions.reap_stale(older_than=reap_after, limit=limit)
    report.expired = transitions.expire_waits(limit=limit)

    silent = Q(heartbeat_at__lt=queries.stale_before(stuck_after)) | Q(heartbeat_at__isnull=True)
    ignored = queries.cancel_not_honoured(grace)
    for run_id in ignored.filter(silent).values_list("pk", flat=True)[:limit]:
        # Re-checked in the UPDATE: a heartbeat that lands now keeps the run alive.
        if transitions.retire(
            run_id, by="watchdog", source=WATCHDOG, note="cancel not honoured; worker silent", guard=silent
        ):
            report.retired.append(run_id)

    for run_id in queries.escalation_due(grace).values_list("pk", flat=True)[:limit]:
        if transitions.escalate_cancel(run_id, by="watchdog", grace_s=grace_s):
            report.escalated.append(run_id)
    hard_stop_ignored = queries.retire_due(escalate)
    for run_id in hard_stop_ignored.values_list("pk", flat=True)[:limit]:
        # The guard re-checks the escalation's age inside the UPDATE.
        if transitions.retire(
            run_id, by="watchdog", source=WATCHDOG, note="cancel not honoured; hard stop ignored",
            guard=Q(cancel_escalated_at__lt=queries.stale_before(escalate)),
        ):
            report.retired.append(run_id)

    report.stuck = queries.stuck(stuck_after).count()
    report.not_honoured = ignored.count()
    if report.acted:
        log.info(
            "watchdog: %d reaped, %d cancelled at deadline, %d told to stop hard, %d retired (cancel not honoured),"
            " %d waits expired",
            len(report.reaped), len(report.deadline_cancelled), len(report.escalated), len(report.retired),
            len(report.expired),
        )
    return report


asweep = database_sync_to_async(sweep)


async def serve(stop, *, interval_s=None):
    """Sweep every `interval_s` (RUNWARDEN_WATCHDOG_S) until `stop` is set. A failing
    sweep is logged and retried next round: the watchdog must outlive a database blip."""
    interval = interval_s if interval_s is not None else settings.RUNWARDEN_WATCHDOG_S
    while not stop.is_set():
        try:
            await asweep()
        except Exception:  # noqa: BLE001 - keep watching; the next sweep retries
            log.exception("watchdog sweep failed")
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
        except TimeoutError:
            pass
