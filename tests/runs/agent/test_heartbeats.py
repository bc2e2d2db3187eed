"""The worker's one heartbeat loop: one heartbeat_many per interval for all its runs,
and the slow path of cancel delivery when the control plane is down."""

import asyncio
import dataclasses
import logging

import pytest

from runs import transitions
from runs.agent.db_pool import DbPool
from runs.agent.fastpath import FastPath
from runs.agent.worker import Worker
from runs.models import Run
from tests.runs.agent.conftest import say, until_status, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


class Recording(DbPool):
    """A real pool that notes which transition each call ran and with how many runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def _note(self, fn, args):
        ids = args[0] if args and isinstance(args[0], list) else None
        self.calls.append((getattr(fn, "__name__", ""), len(ids) if ids is not None else None))

    async def call(self, fn, /, *args, **kwargs):
        self._note(fn, args)
        return await super().call(fn, *args, **kwargs)

    async def urgent(self, fn, /, *args, **kwargs):
        self._note(fn, args)
        return await super().urgent(fn, *args, **kwargs)

    def named(self, name):
        return [n for fn, n in self.calls if fn == name]


@pytest.fixture
def recording(transactional_db):
    pool = Recording(size=4, name="rw-test-rec")
    yield pool
    pool.close()


async def start(config, db, fastpath, concurrency):
    worker = Worker("w-test", config=config, db=db, fastpath=fastpath, concurrency=concurrency)
    stop = asyncio.Event()
    task = asyncio.ensure_future(worker.serve(stop))
    await asyncio.wait_for(worker.ready.wait(), 5)
    return worker, stop, task


async def create_many(pool, n, script):
    def make():
        return [transitions.create_run(agent="scripted", input={"script": script}).id for _ in range(n)]

    return await pool.call(make)


async def all_running(pool, ids):
    while await pool.call(lambda: Run.objects.filter(pk__in=ids, status="running").count()) < len(ids):
        await asyncio.sleep(0.01)


async def test_one_heartbeat_statement_per_interval_covers_every_run(config, recording):
    config = dataclasses.replace(config, heartbeat_s=0.1, shutdown_grace_s=0.1)
    ids = await create_many(recording, 30, [say(300, 10)])  # ~3 s each
    worker, stop, task = await start(config, recording, FastPath.off(), concurrency=30)
    await asyncio.wait_for(all_running(recording, ids), 20)
    full = lambda: recording.named("heartbeat_many").count(30)  # noqa: E731
    await asyncio.wait_for(wait_for(lambda: full() >= 5, timeout=10), 15)
    sizes = recording.named("heartbeat_many")
    stop.set()
    await asyncio.wait_for(task, 20)
    # Once all are held, each beat is ONE call for all 30 runs. Between the first and
    # the fifth of those only a welcome beat already gathered may slip in; beating per
    # run would have made 30 calls an interval.
    first, fifth = sizes.index(30), [i for i, n in enumerate(sizes) if n == 30][4]
    assert fifth - first - 4 <= 2, sizes
    assert recording.named("heartbeat") == []


async def test_a_cancel_lands_through_the_batched_heartbeat_with_the_fast_path_down(config, recording, caplog):
    caplog.set_level(logging.INFO, logger="runs.agent.runner")
    config = dataclasses.replace(config, shutdown_grace_s=0.1)
    ids = await create_many(recording, 6, [say(400, 10)])  # ~4 s each
    worker, stop, task = await start(config, recording, FastPath.off(), concurrency=6)
    await asyncio.wait_for(all_running(recording, ids), 10)
    doomed = ids[:3]
    for run_id in doomed:
        assert await recording.call(transitions.request_cancel, run_id, by="op") == transitions.CancelOutcome.REQUESTED
    for run_id in doomed:
        assert await until_status(recording, run_id, "cancelled", timeout=10) == "cancelled"
    rows = await recording.call(lambda: {r.id: r.status for r in Run.objects.filter(pk__in=ids)})
    assert {rows[i] for i in ids[3:]} == {"running"}  # the others go on
    stop.set()
    await asyncio.wait_for(task, 20)
    settled = [r.getMessage() for r in caplog.records if "settled cancelled/cancelled" in r.getMessage()]
    cancelled_by_op = [line for line in settled if any(str(i) in line for i in doomed)]
    assert len(cancelled_by_op) == 3 and all("cancel via heartbeat" in line for line in cancelled_by_op)


@pytest.mark.parametrize("parking", [True, False])
async def test_a_beat_answered_after_the_engine_released_its_run_does_not_stop_it(recording, parking):
    """The engine releases a run to wait (suspend with release) while a beat is in
    flight: the beat's "not held" is that release, not a retire, so the run is not
    hard-stopped (it was, and the engine reported LOST instead of PARKED). Without the
    parking mark, "not held" still stops the run at once."""
    from runs.agent.cancel import CancelSignal
    from runs.agent.heartbeats import Heartbeats
    from runs.agent.runner import RunState

    def released():
        run = transitions.create_run(agent="scripted")
        assert transitions.claim(run.id, worker="w-test")
        assert transitions.suspend(run.id, worker="w-test", status="waiting_for_approval", request={}, release=True)
        return run.id

    run_id = await recording.call(released)
    state = RunState(run_id, CancelSignal(), parking=parking)
    beats = Heartbeats(worker_id="w-test", db=recording, interval_s=60)
    beats._runs[run_id] = (state, None)  # registered before the release, as execute() does
    await beats._beat([run_id])
    assert (state.lost, state.signal.is_cancelled()) == (not parking, not parking)
