import os

import pytest
from django.core.management import call_command
from django.db import connection

from runs import transitions
from runs.models import Run


def pytest_sessionstart(session):
    """Tests run with DEBUG=0, so pages link to the hashed files `collectstatic` writes,
    and `dashboard.asgi` (imported while collecting) refuses to start without them.
    Before collection, then; incremental, so cheap when nothing changed. `scripts/test`
    points STATIC_ROOT at a folder of its own per run."""
    call_command("collectstatic", "--noinput", verbosity=0)


# The suite's race tests and worker subprocesses hold more connections at once (one per
# thread) than a server's pool allows: they connect directly, even after a test imported
# dashboard.asgi (which turns the pool on for servers). The pool itself is exercised by
# the daphne subprocesses of tests/dashboard/test_outage.py, which ask for it.
os.environ["RUNWARDEN_DB_POOL"] = "0"


def claim_new_run(*, worker="w1", agent="scripted", title="a run", **kwargs):
    """A new run claimed by `worker`, through the transitions, as its fresh row: the one
    "claimed run" helper behind every fixture that needs one (async tests wrap it)."""
    run = transitions.create_run(agent=agent, title=title, **kwargs)
    assert transitions.claim(run.id, worker=worker)
    return Run.objects.get(pk=run.id)


@pytest.fixture
def make_run(db):
    """Create a queued run (through the transitions, as everything else does)."""

    def make(**kwargs):
        kwargs.setdefault("agent", "scripted")
        kwargs.setdefault("title", "a run")
        return transitions.create_run(**kwargs)

    return make


@pytest.fixture
def running_run(db):
    """`running_run(worker="w1", **create_run kwargs)`: see `claim_new_run`."""
    return claim_new_run


@pytest.fixture
def postgres(transactional_db):
    """Real races need PostgreSQL (row locks, many connections); skip elsewhere."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: run `make test` with it reachable")


@pytest.fixture
def released_in(db):
    """A run waiting in `status` that the engine released (no holder), as `w1` leaves it:
    its gated reply kept for the resume, its wait ending `timeout_s` from now."""

    def make(status="waiting_for_approval", timeout_s=300, **kwargs):
        run = claim_new_run(worker="w1", **kwargs)
        step = {"index": 0, "text": "may I?", "tool_calls": [{"id": "c0", "name": "echo", "args": {}}],
                "tokens_in": 3, "tokens_out": 4, "cost": "0.01", "approved": []}
        request = {"kind": "approval", "call_id": "c0", "tool": "echo", "resume": {"step": step, "taken": []}}
        assert transitions.suspend(
            run.id, worker="w1", status=status, request=request, release=True, timeout_s=timeout_s,
            charge={"tokens_in": 3, "tokens_out": 4, "cost": "0.01"},
        )
        return Run.objects.get(pk=run.id)

    return make
