from datetime import timedelta

import pytest

from runs import transitions
from runs.models import Run

STATUSES = [s.value for s in Run.Status]


@pytest.fixture
def run_in(make_run):
    """A run brought to `status` through the transitions themselves (worker `w1`)."""

    def make(status, **kwargs):
        run = make_run(**kwargs)
        if status == "queued":
            return run
        if status == "cancelled":
            assert transitions.request_cancel(run.id) == transitions.CancelOutcome.SETTLED
            return Run.objects.get(pk=run.id)
        assert transitions.claim(run.id, worker="w1")
        if status in Run.WAITING:
            assert transitions.suspend(run.id, worker="w1", status=status, request={"tool": "rm"})
        elif status == "completed":
            assert transitions.settle(run.id, status="completed", reason="completed", worker="w1")
        elif status == "failed":
            assert transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1")
        return Run.objects.get(pk=run.id)

    return make


@pytest.fixture
def released_in(make_run):
    """A run waiting in `status` that the engine released (no holder), as `w1` leaves it:
    its gated reply kept for the resume, its wait ending `timeout_s` from now."""

    def make(status="waiting_for_approval", timeout_s=300, **kwargs):
        run = make_run(**kwargs)
        assert transitions.claim(run.id, worker="w1")
        step = {"index": 0, "text": "may I?", "tool_calls": [{"id": "c0", "name": "echo", "args": {}}],
                "tokens_in": 3, "tokens_out": 4, "cost": "0.01", "approved": []}
        request = {"kind": "approval", "call_id": "c0", "tool": "echo", "resume": {"step": step, "taken": []}}
        assert transitions.suspend(
            run.id, worker="w1", status=status, request=request, release=True, timeout_s=timeout_s,
            charge={"tokens_in": 3, "tokens_out": 4, "cost": "0.01"},
        )
        return Run.objects.get(pk=run.id)

    return make


LONG_AGO = timedelta(seconds=-60)  # "older than minus a minute": every heartbeat is stale
