"""Fixtures for the engine: a real database (threads cross it, hence transaction=True),
a database pool, the in-memory channel layer, and a fast engine configuration."""

import asyncio

import pytest
from channels.layers import get_channel_layer

from runs import transitions
from runs.agent.breaker import Breakers
from runs.agent.config import EngineConfig
from runs.agent.db_pool import DbPool
from runs.agent.fastpath import FastPath
from runs.agent.loop import Stats
from runs.agent.runner import WorkerContext
from runs.models import Run, RunEvent, Step
from tests.conftest import claim_new_run

WORKER = "w-test"


@pytest.fixture
def config(tmp_path):
    return EngineConfig(
        heartbeat_s=0.05, retries=2, backoff_base_s=0.01, backoff_max_s=0.02,
        stream_first_event_s=5, stream_idle_s=5, approval_timeout_s=5,
        breaker_threshold=3, claim_poll_s=0.05, shutdown_grace_s=5, workspace=tmp_path / "ws",
    )


@pytest.fixture
def pool(transactional_db):
    pool = DbPool(size=4, name="rw-test-db")
    yield pool
    pool.close()


@pytest.fixture
def ctx(pool, config):
    return WorkerContext(
        worker_id=WORKER, db=pool, fastpath=FastPath(get_channel_layer()), config=config,
        breakers=Breakers(threshold=config.breaker_threshold, reset_s=60), stats=Stats(),
    )


@pytest.fixture
def claimed(pool):
    """`await claimed(script=[...], **limits)`: a queued scripted run claimed by WORKER."""

    async def make(script=(), worker=WORKER, **kwargs):
        return await pool.call(lambda: claim_new_run(worker=worker, title="t", input={"script": list(script)}, **kwargs))

    return make


@pytest.fixture
def fetch(pool):
    """`await fetch(run_id)` -> (run, [steps], [event kinds], {kind: [data]})"""

    async def get(run_id):
        def read():
            run = Run.objects.get(pk=run_id)
            steps = list(Step.objects.filter(run_id=run_id).order_by("index"))
            events = list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))
            by_kind = {}
            for event in events:
                by_kind.setdefault(event.kind, []).append(event.data)
            return run, steps, [e.kind for e in events], by_kind

        return await pool.call(read)

    return get


def say(words, delay_ms=0):
    return {"say": " ".join(f"w{i}" for i in range(words)), "token_delay_ms": delay_ms}


async def wait_for(predicate, timeout=5.0):
    """Yield to the loop until `predicate()` holds (for in-process state with no event)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def until_status(pool, run_id, *statuses, timeout=5):
    """Poll the run's row until its status is one of `statuses` (the run is driven
    elsewhere; a row has no event to await). Returns the status."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status = await pool.call(lambda: Run.objects.values_list("status", flat=True).get(pk=run_id))
        if status in statuses:
            return status
        assert loop.time() < deadline, f"run {run_id} stuck in {status}, expected {statuses}"
        await asyncio.sleep(0.01)
