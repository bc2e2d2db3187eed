"""The engine's database pool: its lanes, its loop binding, its shutdown, and how it
replaces a connection the server dropped."""

import asyncio
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError, ProgrammingError, connection, transaction

from runs import transitions
from runs.agent import db_pool
from runs.agent.db_pool import DbPool, retry_safe

pytestmark = pytest.mark.asyncio


async def _loop():
    return asyncio.get_running_loop()


async def test_a_settle_in_the_urgent_lane_never_queues_behind_busy_calls():
    pool = DbPool(size=1, urgent_size=1)
    release = threading.Event()
    busy = asyncio.ensure_future(pool.call(release.wait))  # the only regular thread is stuck
    queued = asyncio.ensure_future(pool.call(lambda: "queued"))
    assert await asyncio.wait_for(pool.urgent(lambda: "settled"), 2) == "settled"
    assert not queued.done()
    release.set()
    assert await asyncio.wait_for(queued, 2) == "queued" and await busy
    pool.close()


async def test_broadcasts_run_on_the_loop_the_pool_is_told():
    here = asyncio.get_running_loop()
    caller, default = DbPool(size=1, broadcast_loop="caller"), DbPool(size=1)
    # With the in-memory layer, a broadcast must run on the loop that owns the queues.
    assert await caller.call(async_to_sync(_loop)) is here
    assert await default.call(async_to_sync(_loop)) is not here
    for pool in (caller, default):
        pool.close()


async def test_errors_reach_the_caller_and_a_closed_pool_refuses_calls():
    pool = DbPool(size=1)
    with pytest.raises(ZeroDivisionError):
        await pool.call(lambda: 1 / 0)
    pool.close()
    with pytest.raises(RuntimeError):
        await pool.call(lambda: None)


# --- connections the server dropped (PostgreSQL: pg_terminate_backend) -----------------


@pytest.fixture
def pg_pool(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (pg_terminate_backend)")
    pool = DbPool(size=1, urgent_size=1)  # one thread per lane: every call meets the dropped connection
    yield pool
    pool.close()


def backend_pid():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def terminate(pid):
    """Kill one backend from the test's own connection and wait until it is gone."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert cursor.fetchone()[0]
        deadline = time.monotonic() + 10
        while True:  # the backend exits asynchronously; nothing to await but its row
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone()[0] == 0:
                return
            assert time.monotonic() < deadline, f"backend {pid} still alive"
            time.sleep(0.01)


async def killed(pool, lane="call"):
    """The lane's connection, opened and then terminated server-side while idle."""
    pid = await getattr(pool, lane)(backend_pid)
    await pool.call(terminate, pid) if lane == "urgent" else await pool.urgent(terminate, pid)  # from the other lane
    return pid


async def test_a_guarded_call_on_a_connection_killed_server_side_runs_again_on_a_fresh_one(pg_pool):
    run = await pg_pool.call(lambda: transitions.create_run(agent="scripted"))
    assert await pg_pool.call(transitions.claim, run.id, worker="w")
    await killed(pg_pool)
    assert (await pg_pool.call(transitions.heartbeat, run.id, worker="w")).held
    await killed(pg_pool, "urgent")  # the lane a cancelled run's settle takes
    assert await pg_pool.urgent(transitions.settle, run.id, status="cancelled", reason="cancelled", worker="w")
    assert not pg_pool.outage.active  # a dropped connection is not an outage


async def test_a_call_whose_first_statement_was_in_a_transaction_runs_again(pg_pool):
    pid = await killed(pg_pool)
    calls = []

    def in_transaction():
        calls.append(1)
        with transaction.atomic():
            return backend_pid()

    assert await pg_pool.call(in_transaction) != pid
    assert len(calls) == 2  # nothing can have committed: the first statement never ran


async def test_an_autocommit_call_not_marked_retry_safe_is_not_repeated(pg_pool):
    await killed(pg_pool)
    calls = []

    def once():
        calls.append(1)
        return backend_pid()

    with pytest.raises(OperationalError):
        await pg_pool.call(once)
    assert len(calls) == 1  # it might have reached the database: the caller decides
    assert await pg_pool.call(once)  # the broken connection was closed: the next call reconnects
    await killed(pg_pool)
    assert await pg_pool.call(retry_safe(once)) and len(calls) == 4


async def test_an_error_the_database_answered_is_not_repeated(pg_pool):
    calls = []

    def bad():
        calls.append(1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    with pytest.raises(ProgrammingError):
        await pg_pool.call(retry_safe(bad))
    assert len(calls) == 1 and not pg_pool.outage.active


# --- outage logging --------------------------------------------------------------------


async def test_an_outage_logs_one_warning_down_a_count_while_down_and_one_on_recovery(caplog, monkeypatch):
    outage = db_pool.Outage("rw-db-x")
    caplog.set_level("DEBUG", logger="runs.agent.db_pool")
    outage.answered()  # healthy: nothing to say
    for _ in range(50):
        outage.failed(OperationalError("connection refused\n\tIs the server running?"))
    assert outage.active
    monkeypatch.setattr(db_pool, "OUTAGE_REPORT_S", 0.0)  # the next failure is due a count
    outage.failed(OperationalError("connection refused"))
    outage.answered()
    outage.answered()
    assert not outage.active
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("WARNING", "rw-db-x: database unreachable (connection refused); retrying, runs hold their outcome"),
        ("WARNING", lines[1][1]),
        ("WARNING", lines[2][1]),
    ]
    assert "still unreachable" in lines[1][1] and "51 call(s) failed so far" in lines[1][1]
    assert "answering again" in lines[2][1] and "51 call(s) failed meanwhile" in lines[2][1]


@pytest.mark.django_db(transaction=True)
async def test_a_worker_with_concurrency_200_keeps_to_its_connection_budget(config, transactional_db):
    """200 live runs on a budget of 4 connections (2 regular, 2 urgent): their calls queue
    for the pool, all 200 are live at once, all 200 end when cancelled (through the one
    batched heartbeat: no fast path here), and on PostgreSQL the worker never holds
    more than 4 connections (counted by the server, for this test database only)."""
    import dataclasses

    from django.db import connection

    from runs import transitions
    from runs.agent.fastpath import FastPath
    from runs.agent.worker import Worker
    from runs.models import Run

    config = dataclasses.replace(config, worker_db_connections=4, heartbeat_s=0.2)
    name = connection.settings_dict["NAME"]

    def open_connections():
        if connection.vendor != "postgresql":
            return 0
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [name])
            return cursor.fetchone()[0]

    def count(status):
        return Run.objects.filter(pk__in=ids, status=status).count()

    # Slow streams (5 tokens a second, ~60 s): all 200 are still live when the last is claimed.
    script = [{"say": " ".join(f"w{i}" for i in range(300)), "token_delay_ms": 200}]
    # The test's own calls on one thread (one connection), opened before the baseline.
    pool = DbPool(size=1, urgent_size=1, name="rw-test-budget")
    ids = await pool.call(lambda: [transitions.create_run(agent="scripted", input={"script": script}).id for _ in range(200)])
    await pool.urgent(open_connections)
    baseline = await pool.call(open_connections)  # the test's own connections only
    worker = Worker("w-budget", config=config, concurrency=200, fastpath=FastPath.off())
    stop = asyncio.Event()
    task = asyncio.ensure_future(worker.serve(stop))
    peak = 0

    async def sample_until(status):
        nonlocal peak
        while await pool.call(count, status) < len(ids):
            peak = max(peak, await pool.call(open_connections) - baseline)
            assert not task.done(), "the worker stopped"
            await asyncio.sleep(0.05)  # a sampling clock: a connection count has no event

    try:
        await asyncio.wait_for(sample_until("running"), 50)
        for run_id in ids:
            await pool.call(transitions.request_cancel, run_id, by="op")
        await asyncio.wait_for(sample_until("cancelled"), 50)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await pool.aclose()
    assert peak <= 4


def test_the_budget_is_split_between_the_lanes():
    from runs.agent.worker import pool_lanes

    assert [pool_lanes(n) for n in (2, 5, 8, 20)] == [(1, 1), (3, 2), (4, 4), (10, 10)]


@pytest.mark.parametrize("value,expected", [("many", "is not a number"), ("1", "must be at least 2")])
def test_a_wrong_pool_size_is_one_line_naming_the_variable(value, expected):
    import os
    import subprocess
    import sys

    from django.conf import settings

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"SECRET_KEY": "x", "RUNWARDEN_WORKER_DB_CONNECTIONS": value})
    done = subprocess.run(
        [sys.executable, str(settings.BASE_DIR / "manage.py"), "check"], env=env, capture_output=True, text=True, timeout=60,
    )
    (line,) = done.stderr.strip().splitlines()
    assert done.returncode != 0 and line.startswith("runwarden: configuration error: RUNWARDEN_WORKER_DB_CONNECTIONS=")
    assert expected in line
