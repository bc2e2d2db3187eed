"""The engine's database pool: its lanes, its loop binding, its shutdown, and how it
replaces a connection the server dropped."""

import asyncio
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError, ProgrammingError, connection, transaction

from runs import transitions
from runs.agent import db
from runs.agent.db import DbPool, retry_safe

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
    outage = db.Outage("rw-db-x")
    caplog.set_level("DEBUG", logger="runs.agent.db")
    outage.answered()  # healthy: nothing to say
    for _ in range(50):
        outage.failed(OperationalError("connection refused\n\tIs the server running?"))
    assert outage.active
    monkeypatch.setattr(db, "OUTAGE_REPORT_S", 0.0)  # the next failure is due a count
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
