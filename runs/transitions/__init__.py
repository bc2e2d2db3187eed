"""Every change of a run's status, each one guarded.

A transition is one conditional UPDATE (`WHERE id = … AND status IN (<allowed from>)`,
plus any extra guard such as "held by this worker") whose row count says whether it
won. The winner writes the run's event in the same transaction and broadcasts after
commit; a loser changes nothing. There is no read-modify-write of status anywhere:
terminal is terminal, and a late settle keeps the first outcome.

    verb            from                       to
    create_run      -                          queued
    claim(_next)    queued                     running     answered (resumed) runs first
    heartbeat       running, waiting_*         (same)      held by the worker
    heartbeat_many  running, waiting_*         (same)      one statement for all of a worker's runs
    request_cancel  queued, released waiting_* cancelled   nobody holds it: settle now
    request_cancel  running, held waiting_*    (same) + cancel_requested_at
    suspend         running                    waiting_*   held by the worker, no cancel pending;
                                                           release=True (the engine): worker
                                                           cleared, no slot, no heartbeat
    resume          held waiting_*             running     claimed once (an API agent's wait)
    resume          released waiting_*         queued      claimed once; any worker resumes it
    settle          running, waiting_*         completed / failed / cancelled
    force_cancel    any non-terminal           cancelled   retire: the worker is gone
    escalate_cancel running, waiting_*         (same) + cancel_escalated_at: hard stop asked, once
    reap_stale      running, stale heartbeat   failed / worker_lost
    expire_waits    released waiting_*, past   failed / approval_denied   the watchdog
                    wait_deadline
    retry           terminal + retryable       new queued run (retry_of), once
"""

from channels.db import database_sync_to_async

from runs.transitions._guard import ALLOWED_FROM, CancelOutcome, Heartbeat, parse_id
from runs.transitions.escalation import escalate_cancel
from runs.transitions.ending import force_cancel, reap_stale, request_cancel, safe_message, settle
from runs.transitions.follow_up import consume_inputs, queue_input, retry
from runs.transitions.lifecycle import claim, claim_next, create_run, heartbeat, heartbeat_many, resume, suspend
from runs.transitions.steps import commit_step, record_discard
from runs.transitions.waiting import expire_waits

__all__ = [
    "ALLOWED_FROM", "CancelOutcome", "Heartbeat", "parse_id", "create_run", "claim", "claim_next",
    "heartbeat", "heartbeat_many", "request_cancel", "force_cancel", "reap_stale", "suspend", "resume", "settle",
    "safe_message", "retry", "queue_input", "consume_inputs", "commit_step", "record_discard", "escalate_cancel",
    "expire_waits",
]

# Async twins, for consumers and the engine.
acreate_run = database_sync_to_async(create_run)
aclaim = database_sync_to_async(claim)
aclaim_next = database_sync_to_async(claim_next)
aheartbeat = database_sync_to_async(heartbeat)
arequest_cancel = database_sync_to_async(request_cancel)
aforce_cancel = database_sync_to_async(force_cancel)
areap_stale = database_sync_to_async(reap_stale)
asuspend = database_sync_to_async(suspend)
aresume = database_sync_to_async(resume)
asettle = database_sync_to_async(settle)
aretry = database_sync_to_async(retry)
aqueue_input = database_sync_to_async(queue_input)
aconsume_inputs = database_sync_to_async(consume_inputs)
acommit_step = database_sync_to_async(commit_step)
