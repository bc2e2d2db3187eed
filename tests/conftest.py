import os

import pytest
from django.core.management import call_command
from django.db import connection

from runs import agent_caps, transitions
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


@pytest.fixture(autouse=True)
def _fresh_agent_caps():
    """The per-process memo of capped agents (runs/agent_caps.py) must not carry one
    test's rolled-back policies and runs into the next."""
    agent_caps.forget()
    yield
    agent_caps.forget()


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


@pytest.fixture(scope="session")
def live_server_url(django_db_setup, django_db_blocker):
    """A real daphne serving dashboard.asgi on the test database, in its own process:
    the agent API's end-to-end tests and the browser tests share it.

    The channel layer is the test process's: with Redis (REDIS_URL, or the browser tests'
    `_shared_layer`) the server gets the same URL and prefix, so the two share it; without
    it, the server has its own in-memory one. Static files are served by the app itself
    (ServeStatic, DEBUG=0), as in production."""
    with django_db_blocker.unblock():
        url, server = start_daphne(_layer_env())
    yield url
    server.terminate()
    server.wait(timeout=10)


def start_daphne(layer_env):
    """Start daphne on the test database in a process of its own (a fresh interpreter,
    never a fork of this one: a fork would inherit Playwright's loop and open sockets),
    with `layer_env` (REDIS_URL and prefix, or {} for an in-memory layer). Returns
    (its URL, the process) once it accepts connections."""
    import os
    import socket
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from django.db import connection, connections

    database = connection.settings_dict
    if connection.vendor == "sqlite":
        url = f"sqlite:///{database['NAME']}"
    else:
        url = f"postgres://{database['USER']}@{database['HOST']}:{database['PORT'] or 5432}/{database['NAME']}"
    connections.close_all()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": url, "DEBUG": "0", "SECRET_KEY": os.environ.get("SECRET_KEY") or "test",
           "ALLOWED_HOSTS": "127.0.0.1,localhost", "RUNWARDEN_EMBEDDED": "0", **layer_env}
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "dashboard.asgi:application"],
        cwd=Path(__file__).resolve().parents[1], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    for line in server.stderr:  # daphne logs "Listening on TCP address …" once it accepts
        if "Listening on TCP address" in line:
            break
    else:
        raise RuntimeError(f"daphne did not start (exit {server.wait()})")
    # Keep draining its log so a chatty server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    return f"http://127.0.0.1:{port}", server


def _layer_env():
    """REDIS_URL and the prefix of this process's Redis layer, for a server to share it."""
    from django.conf import settings

    layer = settings.CHANNEL_LAYERS["default"]
    if "channels_redis" not in layer["BACKEND"]:
        return {}
    return {"REDIS_URL": layer["CONFIG"]["hosts"][0], "RUNWARDEN_CHANNEL_PREFIX": layer["CONFIG"]["prefix"]}
