"""The engine's database pool: its lanes, its loop binding, its shutdown."""

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync

from runs.agent.db import DbPool

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
