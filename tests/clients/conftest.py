"""Fixtures for the official clients: a real daphne (the suite's `live_server_url`,
on the test database: SQLite, or PostgreSQL + Redis in the second pass), keys, and an
operator who aborts over HTTP, as the dashboard's Abort does through the same
`request_cancel` — so the cancel is published on the server's own channel layer and
the test holds on either configuration."""

import threading

import httpx
import pytest

from runs.api.auth import create_key
from runs.models import Run, RunEvent
from tests.faults import TcpProxy


@pytest.fixture
def agent_key(transactional_db):
    return create_key("client-agent")[1]


@pytest.fixture
def operator(transactional_db, live_server_url):
    token = create_key("client-ops", "operator")[1]
    with httpx.Client(base_url=f"{live_server_url}/api/v1", headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as http:
        yield Operator(http)


class Operator:
    def __init__(self, http):
        self.http = http

    def abort(self, run_id, note="test abort"):
        answer = self.http.post(f"/runs/{run_id}/cancel", json={"note": note})
        assert answer.status_code == 200 and answer.json()["outcome"] == "requested", answer.text
        return answer.json()


@pytest.fixture
def answering(transactional_db):
    """An operator in a thread who answers every approval asked of an `agent` run, as the
    dashboard's Approve/Deny does (`transitions.resume`): approved when `rule(request)`."""
    from django.db import connection

    from runs import transitions

    stop, answered, broken = threading.Event(), [], []

    def start(agent, rule):
        def loop():
            try:
                while not stop.wait(0.05):
                    for run in Run.objects.filter(agent=agent, status=Run.Status.WAITING_FOR_APPROVAL):
                        approved = bool(rule(run.pending_request or {}))
                        answer = {"approved": approved, "note": "test"}
                        if transitions.resume(run.pk, expect="waiting_for_approval", by=None, answer=answer):
                            answered.append(approved)
            except Exception as error:  # the agent would wait for an answer forever: abort it, so the test fails
                broken.append(error)
                for run in Run.objects.filter(agent=agent, status__in=Run.NON_TERMINAL):
                    transitions.request_cancel(run.pk, by="answering fixture", note=repr(error))
            finally:
                connection.close()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return answered

    yield start
    stop.set()
    assert not broken, f"the answering operator failed: {broken[0]!r}"


@pytest.fixture
def proxy(live_server_url):
    """A TcpProxy in front of the server, to cut the client's connections."""
    with TcpProxy(int(live_server_url.rsplit(":", 1)[1])) as tcp:
        yield tcp


def outcome(run_id):
    run = Run.objects.get(pk=run_id)
    return run.status, run.termination_reason


def discarded(run_id):
    return [e.data for e in RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.STEP_DISCARDED).order_by("seq")]


class Background:
    """An agent body in a thread; `result()` re-raises what it raised."""

    def __init__(self, target):
        self.error, self.value = None, None
        self.thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self.thread.start()

    def _run(self, target):
        try:
            self.value = target()
        except BaseException as error:  # handed to the test thread
            self.error = error

    def result(self, timeout=30):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the agent did not stop"
        if self.error is not None:
            raise self.error
        return self.value
