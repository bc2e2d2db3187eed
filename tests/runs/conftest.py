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


LONG_AGO = timedelta(seconds=-60)  # "older than minus a minute": every heartbeat is stale
