import os

import pytest
from django.core.management import call_command
from django.db import connection

from runs import transitions


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


@pytest.fixture
def make_run(db):
    """Create a queued run (through the transitions, as everything else does)."""

    def make(**kwargs):
        kwargs.setdefault("agent", "scripted")
        kwargs.setdefault("title", "a run")
        return transitions.create_run(**kwargs)

    return make


@pytest.fixture
def running_run(make_run):
    """A run claimed by worker `w1`."""

    def make(worker="w1", **kwargs):
        run = make_run(**kwargs)
        assert transitions.claim(run.id, worker=worker)
        run.refresh_from_db()
        return run

    return make


@pytest.fixture
def postgres(transactional_db):
    """Real races need PostgreSQL (row locks, many connections); skip elsewhere."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: run `make test` with it reachable")
