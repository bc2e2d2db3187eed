"""A database outage must not abandon runs: `run_agents` as a real subprocess on
PostgreSQL + Redis, its DATABASE_URL through a loopback proxy (tests/faults.py) that the
test cuts and restores; the shared PostgreSQL itself is never touched. Runs that reach
their outcome during the outage settle it once the database answers, never through the
reaper; a connection the server dropped is replaced without failing the next settle."""

import re
import time

import pytest
from django.db import connection

from runs import transitions
from runs.models import Run, RunEvent, Step
from tests.faults import TcpProxy
from tests.runs.agent.test_e2e_worker import redis_url, start_worker, wait_until  # noqa: F401 - fixtures

OUTAGE_S = 3.0
LONG = " ".join(f"w{i}" for i in range(500))


def streaming_run(title):
    """One short committed step, then a step that streams for ~25 s."""
    return transitions.create_run(
        agent="scripted", title=title,
        input={"script": [{"say": "the first step"}, {"say": LONG, "token_delay_ms": 50}]},
    )


def direct_url():
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def wait_for_log(log, pattern, count, timeout, since=0):
    wait_until(lambda: len(re.findall(pattern, log.read_text()[since:])) >= count, timeout, f"{count} x {pattern!r}")


@pytest.fixture
def proxy(postgres):  # before start_worker in a test's arguments: the worker stops first
    db = connection.settings_dict
    with TcpProxy(int(db["PORT"] or 5432), db["HOST"] or "127.0.0.1") as proxy:
        yield proxy


def test_runs_that_end_during_an_outage_settle_their_true_outcome_once_it_is_back(proxy, start_worker, redis_url):  # noqa: F811
    proc, log = start_worker(redis_url, worker_id="e2e-outage", concurrency=7, DATABASE_URL=proxy.url(direct_url()))
    cancelled = [streaming_run(f"cancelled in the outage {i}") for i in range(3)]
    # Their last step streams ~3 s, so it ends (and must be committed) during the outage.
    finishing = [
        transitions.create_run(agent="scripted", title=f"finishing in the outage {i}", input={"script": [
            {"say": "the first step"}, {"say": " ".join(f"v{j}" for j in range(60)), "token_delay_ms": 50},
        ]})
        for i in range(3)
    ]
    waiting = transitions.create_run(agent="scripted", title="waiting through the outage", input={"script": [
        {"ask_approval": {"tool": "echo", "args": {"n": 1}}}, {"say": "approved and done"},
    ]})
    ids = [r.id for r in cancelled + finishing]
    wait_until(lambda: Run.objects.filter(pk__in=ids, steps=1).count() == 6, 20, "a committed step each")
    wait_until(lambda: Run.objects.get(pk=waiting.id).status == "waiting_for_approval", 20, "waiting")
    committed = {i: list(Step.objects.filter(run_id=i).values_list("index", "text")) for i in ids}

    proxy.cut()  # the worker's database is gone; ours (direct) is not
    for run in cancelled:  # the operator's cancels reach the worker over Redis
        assert transitions.request_cancel(run.id, by="op", source="api") == transitions.CancelOutcome.REQUESTED
    wait_for_log(log, r"settling cancelled/cancelled: database unreachable; holding it", 3, 20)
    wait_for_log(log, r"committing step 1: database unreachable; holding it", 3, 20)
    time.sleep(OUTAGE_S)  # the outage goes on: heartbeats fail meanwhile, held writes back off
    assert Run.objects.filter(pk__in=ids, status="running").count() == 6  # held, not settled, not lost
    assert Step.objects.filter(run_id__in=ids).count() == 6  # nothing written behind our back
    assert Run.objects.get(pk=waiting.id).status == "waiting_for_approval"  # its polls failed: no answer yet
    proxy.restore()
    assert transitions.resume(waiting.id, expect="waiting_for_approval", by="op", answer={"approved": True})

    wait_until(lambda: not Run.objects.filter(pk__in=ids, status__in=Run.NON_TERMINAL).exists(), 30, "all settled")
    wait_until(lambda: Run.objects.get(pk=waiting.id).status == "completed", 30, "the approved run completed")
    assert Run.objects.get(pk=waiting.id).steps == 2
    for run in Run.objects.filter(pk__in=ids):
        kinds = list(RunEvent.objects.filter(run=run).values_list("kind", flat=True))
        assert "reaped" not in kinds and "late_settle_ignored" not in kinds and "retired" not in kinds
        assert RunEvent.objects.get(run=run, kind="settled").actor == "e2e-outage"
        steps = list(Step.objects.filter(run=run).order_by("index").values_list("index", "text"))
        if any(run.id == c.id for c in cancelled):
            assert (run.status, run.termination_reason) == ("cancelled", "cancelled")
            assert steps == committed[run.id]
            assert RunEvent.objects.get(run=run, kind="step_discarded").data["reason"] == "cancelled"
        else:  # the step finished during the outage was committed after it, whole, once
            assert (run.status, run.termination_reason, run.steps) == ("completed", "completed", 2)
            assert steps[:1] == committed[run.id] and steps[1][0] == 1 and steps[1][1].startswith("v0 v1")
            assert "step_discarded" not in kinds
    text = log.read_text()
    # One warning on the way down, one on the way back; no traceback per failed call.
    assert len(re.findall(r"WARNING .*database unreachable \(", text)) == 1, text
    assert len(re.findall(r"WARNING .*database answering again after", text)) == 1, text
    assert "Traceback" not in text and "settle failed" not in text and "claim failed" not in text
    assert text.count("held through a database outage") == 3  # the cancelled; the others settled after it


def test_a_cancel_after_the_server_dropped_the_workers_connections_settles_at_once(start_worker, redis_url):  # noqa: F811
    proc, log = start_worker(redis_url, worker_id="e2e-dropped", concurrency=2)
    first, second = streaming_run("first"), streaming_run("second")
    wait_until(lambda: Run.objects.filter(pk__in=[first.id, second.id], steps=1).count() == 2, 20, "running")
    # A first cancel opens the urgent lane's connection too: every lane holds one now.
    assert transitions.request_cancel(first.id, by="op") == transitions.CancelOutcome.REQUESTED
    wait_until(lambda: Run.objects.get(pk=first.id).status == "cancelled", 20, "the first cancel settled")

    since = len(log.read_text())
    with connection.cursor() as cursor:  # the worker's backends: all of this test database's but ours
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert len(cursor.fetchall()) >= 2
    dropped = time.monotonic()
    assert transitions.request_cancel(second.id, by="op") == transitions.CancelOutcome.REQUESTED
    wait_until(lambda: Run.objects.get(pk=second.id).status == "cancelled", 20, "the second cancel settled")
    settled_in = time.monotonic() - dropped

    row = Run.objects.get(pk=second.id)
    assert (row.termination_reason, row.steps) == ("cancelled", 1)
    wait_for_log(log, f"run {second.id} settled cancelled/cancelled", 1, 10, since=since)  # logged after the commit
    after = log.read_text()[since:]
    # Neither the settle nor any heartbeat failed on a dead connection: each was run again.
    assert "holding the outcome" not in after and "settle failed" not in after
    assert "heartbeat failed" not in after and "Traceback" not in after
    print(f"settled {settled_in * 1000:.0f} ms after the cancel, connections dropped just before")
