"""Waiting for an operator without holding the run: approvals of gated tool calls.

A gated call with no answer yet raises `Park`: the engine persists what it needs to go
on (the in-flight reply, the inputs it took) in `pending_request["resume"]` and
suspends the run releasing it (`transitions.suspend(release=True)`): no worker, no
slot, no heartbeat. The worker moves on to other runs, or may die: nothing waits in
its memory. The operator's answer (`transitions.resume`) queues the run again with an
approval RunInput; whichever worker of its agent claims it rebuilds the history from
the committed steps and hands the answer to `Approvals`: approved runs the gated tool
and commits the step, denied fails the run approval_denied. No answer before the
run's `wait_deadline` is the watchdog's to end (`transitions.expire_waits`).
"""

from runs.agent.outcomes import ApprovalDenied
from runs.models import Run


class Park(Exception):
    """Nothing more to do until an operator answers: release the run."""

    def __init__(self, status, request):
        super().__init__(status)
        self.status = status
        self.request = request


class Approvals:
    def __init__(self, *, signal, granted=()):
        self.signal = signal
        self.granted = set(granted)  # call ids of this step approved before (one per park)
        self.answer = None  # (call_id, RunInput): the answer the run was resumed with

    async def __call__(self, call):
        """Return when `call` is approved; raise ApprovalDenied, Cancelled or Park."""
        self.signal.raise_if_cancelled()
        if call.id in self.granted:
            return
        if self.answer is not None and self.answer[0] == call.id:
            item, self.answer = self.answer[1], None
            payload = item.payload or {}
            if payload.get("approved") is True:
                self.granted.add(call.id)
                return
            note = payload.get("note") or payload.get("reason") or ""
            by = item.created_by or "an operator"
            raise ApprovalDenied(f"{call.name} denied by {by}" + (f": {note}" if note else ""))
        raise Park(
            Run.Status.WAITING_FOR_APPROVAL,
            {"kind": "approval", "call_id": call.id, "tool": call.name, "args": call.args},
        )
