"""Waiting for an operator's approval of a gated tool call.

The run is suspended (`waiting_for_approval`, with the call and its deadline in
`pending_request`); the dashboard answers through `transitions.resume`, which queues
an approval `RunInput`. The wait is cancel-aware (a cancel ends it at once) and
bounded: no answer before the deadline is a denial. A database outage is waited out:
a poll that could not reach the database is no answer yet.
"""

import time
from datetime import timedelta

from django.utils import timezone

from runs import transitions
from runs.agent import racing
from runs.agent.cancel import Cancelled
from runs.agent.db import DatabaseUnavailable
from runs.agent.holding import hold
from runs.agent.outcomes import ApprovalDenied, LostRun
from runs.models import Run, RunInput


class Approvals:
    def __init__(self, *, run_id, worker_id, signal, db, config, timeout_s=None):
        self.run_id = run_id
        self.worker_id = worker_id
        self.signal = signal
        self.db = db
        self.config = config
        self.timeout_s = config.approval_timeout_s if timeout_s is None else timeout_s

    async def __call__(self, call):
        """Return when `call` is approved; raise ApprovalDenied, Cancelled or LostRun."""
        self.signal.raise_if_cancelled()
        deadline = time.monotonic() + self.timeout_s
        request = {
            "kind": "approval",
            "call_id": call.id,
            "tool": call.name,
            "args": call.args,
            "deadline": (timezone.now() + timedelta(seconds=self.timeout_s)).isoformat(),
        }
        suspended, _ = await hold(
            lambda first: self.db.call(
                transitions.suspend, self.run_id, worker=self.worker_id,
                status=Run.Status.WAITING_FOR_APPROVAL, request=request,
            ),
            what=f"run {self.run_id}: suspending for approval", signal=self.signal,
        )
        if not suspended:  # a cancel is pending, or the run is not ours any more
            beat = await self.db.call(transitions.heartbeat, self.run_id, worker=self.worker_id)
            if beat.cancel_requested or self.signal.is_cancelled():
                self.signal.cancel()
                raise Cancelled()
            raise LostRun()
        while True:
            try:
                answers = await self.db.call(transitions.consume_inputs, self.run_id, kind=RunInput.Kind.APPROVAL)
            except DatabaseUnavailable as error:
                if not error.changed_nothing:  # an answer may have been taken and lost with the reply
                    raise
                answers = []  # the database is away: no answer yet; the deadline still holds
            if answers:
                answer = answers[-1].payload or {}
                if answer.get("approved") is True:
                    return
                note = answer.get("note") or answer.get("reason") or ""
                by = answers[-1].created_by or "an operator"
                raise ApprovalDenied(f"{call.name} denied by {by}" + (f": {note}" if note else ""))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ApprovalDenied(f"no answer to approve {call.name} before the deadline")
            await racing.sleep(self.signal, min(self.config.approval_poll_s, remaining))
