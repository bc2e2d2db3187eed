"""Every change of a run's status, each one guarded.

A transition is one conditional UPDATE (`WHERE id = … AND status IN (<allowed from>)`,
plus any extra guard such as "held by this worker") whose row count says whether it
won. The winner writes the run's event in the same transaction and broadcasts after
commit; a loser changes nothing. There is no read-modify-write of status anywhere:
terminal is terminal, and a late settle keeps the first outcome.

Which verb goes from where to where is declared once, in `table.LIFECYCLE` (the
README's lifecycle table is generated from it); what each verb answers, with the
words an operator reads, in `outcomes`. Nothing outside this package writes
`status`, `termination_reason` or `finished_at` (tests/runs/test_status_writes.py).
"""

from channels.db import database_sync_to_async

from runs.transitions._guard import Heartbeat, parse_id
from runs.transitions.ending import reap_stale, request_cancel, retire, safe_message, settle
from runs.transitions.escalation import escalate_cancel
from runs.transitions.follow_up import consume_inputs, queue_input, retry
from runs.transitions.lifecycle import claim, claim_next, create_run, heartbeat, heartbeat_many, resume, suspend
from runs.transitions.outcomes import (
    CancelOutcome, ClaimOutcome, EscalateOutcome, InputOutcome, Kind, Outcome, Result, ResumeOutcome, RetireOutcome,
    RetryOutcome, SettleOutcome, StopOutcome, SuspendOutcome,
)
from runs.transitions.steps import commit_step, record_discard
from runs.transitions.stopping import request_stop
from runs.transitions.table import ALLOWED_FROM, LIFECYCLE
from runs.transitions.waiting import expire_waits

__all__ = [
    "ALLOWED_FROM", "LIFECYCLE", "Heartbeat", "parse_id", "create_run", "claim", "claim_next",
    "heartbeat", "heartbeat_many", "request_cancel", "retire", "reap_stale", "suspend", "resume", "settle",
    "safe_message", "retry", "queue_input", "consume_inputs", "commit_step", "record_discard", "escalate_cancel",
    "expire_waits", "request_stop", "acreate_run",
    "Kind", "Outcome", "Result", "CancelOutcome", "ClaimOutcome", "EscalateOutcome", "InputOutcome", "ResumeOutcome",
    "RetireOutcome", "RetryOutcome", "SettleOutcome", "StopOutcome", "SuspendOutcome",
]

# The one async twin something calls (the demo feed); others call the sync verbs
# through their own database pool or database_sync_to_async.
acreate_run = database_sync_to_async(create_run)
acreate_run.__doc__ = "See create_run()."
