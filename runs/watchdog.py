"""The watchdog: finds runs nobody is looking after and settles them, each guarded.

Every sweep, on the database clock (one clock for every node); the rules and their
thresholds are `runs.rules`:

    finding               rule                                             action
    stuck                 live, heartbeat older than RUNWARDEN_STUCK_S     flagged (derived, counted)
    lost                  running, heartbeat older than RUNWARDEN_REAP_S   reap: failed / worker_lost
    unanswered wait       released waiting_*, past its wait_deadline       failed / approval_denied
    past deadline         non-terminal, deadline passed, no cancel yet     request a stop, budget_exhausted
                                                                           (the wall-clock budget; the run's
                                                                           worker may be first)
    cancel not honoured   cancel older than RUNWARDEN_CANCEL_GRACE_S       escalate: the worker is told
                                                                           to stop hard (once)
    hard stop ignored     escalated over RUNWARDEN_CANCEL_ESCALATE_S ago   retire
    agent over its cap    live, its agent's 24 h spend reached a cap       request stop: budget_exhausted
                          (runs/agent_caps.py), no stop or abort pending   (agent_tokens_24h / _cost_24h)
    ignored and silent    not honoured, heartbeat stale as well            retire at once
    no progress           running and heartbeating, nothing new for the    flag no_progress (once); under
                          agent's T (RUNWARDEN_NO_PROGRESS_S)              the agent's `stop` policy, stop

After the table, the alert scans (`runs.alerts.scans`: stuck, waiting too long, failure
rate) write their deliveries; `serve` sends due deliveries in a task of its own.

A waiting run the engine released holds no heartbeat: it is never stuck nor reaped,
only ended at its wait deadline (`approval_timeout_s`). Staleness is re-checked inside each UPDATE, so a heartbeat landing at the same moment
wins. A sweep is idempotent: two watchdogs (or two servers) can run side by side.
"""

import asyncio
import logging
from dataclasses import dataclass, field
from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Q

from runs import agent_caps, loops, rules, transitions
from runs.alerts import delivery as alert_delivery
from runs.alerts import scans as alert_scans
from runs.models import Run

log = logging.getLogger(__name__)
WATCHDOG = Run.CancelSource.WATCHDOG


@dataclass
class Sweep:
    stuck: int = 0
    not_honoured: int = 0
    reaped: list = field(default_factory=list)
    deadline_stopped: list = field(default_factory=list)
    retired: list = field(default_factory=list)
    escalated: list = field(default_factory=list)
    expired: list = field(default_factory=list)  # waits nobody answered in time
    alerts: int = 0  # deliveries the alert scans wrote (stuck, waiting too long, failure rate)
    no_progress: list = field(default_factory=list)  # flagged: heartbeating, going nowhere (runs.loops)
    agent_capped: list = field(default_factory=list)  # live runs of an agent over its 24 h cap, asked to stop

    @property
    def acted(self):
        return bool(self.reaped or self.deadline_stopped or self.retired or self.escalated or self.expired
                    or self.no_progress or self.agent_capped)


def stop_past_deadline(run_ids=None, *, by="watchdog", source=WATCHDOG, limit=500):
    """Ask each run past its deadline (`rules.DEADLINE_PASSED`, on the database clock) to
    stop: its wall-clock budget is spent (it ends completed/budget_exhausted, truncated),
    with the one deadline note; `run_ids` narrows it to those runs. The watchdog and a
    run's own worker both call it, each as itself. Returns the ids asked (or settled)."""
    runs = Run.objects.filter(rules.DEADLINE_PASSED)
    if run_ids is not None:
        runs = runs.filter(pk__in=list(run_ids))
    cancelled = []
    for run_id in runs.values_list("pk", flat=True)[:limit]:
        outcome = transitions.request_stop(
            run_id, reason=Run.TerminationReason.BUDGET_EXHAUSTED, limit="wall_clock", by=by, source=source,
            note=rules.DEADLINE_NOTE,
        )
        if outcome:  # REQUESTED, or SETTLED for a run nobody held
            cancelled.append(run_id)
    return cancelled


def sweep(*, stuck_s=None, reap_s=None, grace_s=None, escalate_s=None, limit=500):
    """One pass of the table above; returns what it found and did."""
    limits = rules.thresholds(stuck_s=stuck_s, reap_s=reap_s, grace_s=grace_s, escalate_s=escalate_s)
    report = Sweep()

    report.deadline_stopped = stop_past_deadline(limit=limit)
    report.reaped = transitions.reap_stale(older_than=limits.reap, limit=limit)
    report.expired = transitions.expire_waits(limit=limit)
    report.agent_capped = agent_caps.stop_live_runs(limit=limit)

    silent = rules.silent(limits.stuck)
    ignored = Run.objects.filter(rules.not_honoured(limits.grace))
    for run_id in ignored.filter(silent).values_list("pk", flat=True)[:limit]:
        # Re-checked in the UPDATE: a heartbeat that lands now keeps the run alive.
        if transitions.retire(
            run_id, by="watchdog", source=WATCHDOG, note="cancel not honoured; worker silent", guard=silent
        ):
            report.retired.append(run_id)

    for run_id in Run.objects.filter(rules.escalation_due(limits.grace)).values_list("pk", flat=True)[:limit]:
        if transitions.escalate_cancel(run_id, by="watchdog", grace_s=limits.grace.total_seconds()):
            report.escalated.append(run_id)
    hard_stop_ignored = Run.objects.filter(rules.retire_due(limits.escalate))
    for run_id in hard_stop_ignored.values_list("pk", flat=True)[:limit]:
        # The guard re-checks the escalation's age inside the UPDATE.
        if transitions.retire(
            run_id, by="watchdog", source=WATCHDOG, note="cancel not honoured; hard stop ignored",
            guard=Q(cancel_escalated_at__lt=rules.stale_before(limits.escalate)),
        ):
            report.retired.append(run_id)

    report.no_progress = loops.flag_stalled(limit=limit)

    report.stuck = Run.objects.filter(rules.stuck(limits.stuck)).count()
    report.not_honoured = ignored.count()
    report.alerts = alert_scans.scan(stuck_after=limits.stuck, limit=limit)
    if report.alerts:
        log.info("watchdog: %d alert(s) queued (stuck, waiting too long, failure rate)", report.alerts)
    if report.acted:
        log.info(
            "watchdog: %d reaped, %d stopped at deadline, %d told to stop hard, %d retired (cancel not honoured),"
            " %d waits expired, %d flagged no progress, %d asked to stop (agent 24 h cap)",
            len(report.reaped), len(report.deadline_stopped), len(report.escalated), len(report.retired),
            len(report.expired), len(report.no_progress), len(report.agent_capped),
        )
    return report


asweep = database_sync_to_async(sweep)


async def serve(stop, *, interval_s=None):
    """Sweep every `interval_s` (RUNWARDEN_WATCHDOG_S) until `stop` is set. A failing
    sweep is logged and retried next round: the watchdog must outlive a database blip."""
    interval = interval_s if interval_s is not None else settings.RUNWARDEN_WATCHDOG_S
    # Alerts are sent by a task of their own: a receiver that hangs never delays a sweep.
    delivering = asyncio.ensure_future(alert_delivery.serve(stop, interval_s=interval))
    try:
        while not stop.is_set():
            try:
                await asweep()
            except Exception:  # noqa: BLE001 - keep watching; the next sweep retries
                log.exception("watchdog sweep failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval)
            except TimeoutError:
                pass
    finally:
        delivering.cancel()
        await asyncio.gather(delivering, return_exceptions=True)
