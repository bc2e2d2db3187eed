"""The embedded default: worker and watchdog on the server's own event loop."""

import asyncio
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from runs import groups, transitions
from runs.agent import in_process
from runs.models import Run


async def until(layer, channel, event):
    while (message := await layer.receive(channel)).get("event") != event:
        pass
    return message


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_embedded_start_runs_queued_runs_and_reaps_lost_ones(settings, tmp_path):
    settings.RUNWARDEN_REAP_S = 5
    settings.RUNWARDEN_WATCHDOG_S = 0.05
    settings.RUNWARDEN_HEARTBEAT_S = 0.05
    settings.RUNWARDEN_CLAIM_POLL_S = 0.05
    settings.RUNWARDEN_WORKSPACE = tmp_path
    layer = get_channel_layer()
    # A run some other worker took and then lost: the embedded watchdog must reap it.
    lost = await transitions.acreate_run(agent="someone-elses")
    assert await database_sync_to_async(transitions.claim)(lost.id, worker="dead-worker")
    stale = timezone.now() - timedelta(minutes=5)
    await database_sync_to_async(Run.objects.filter(pk=lost.id).update)(heartbeat_at=stale)
    lost_channel = await layer.new_channel()
    await layer.group_add(groups.viewers(lost.id), lost_channel)

    run = await transitions.acreate_run(agent="scripted", input={"script": [{"say": "hello there"}]})
    channel = await layer.new_channel()
    await layer.group_add(groups.viewers(run.id), channel)

    stop = in_process.start(with_demo=False)
    assert in_process.start(with_demo=False) is stop  # once per loop
    try:
        await asyncio.wait_for(until(layer, channel, "settled"), 10)
        await asyncio.wait_for(until(layer, lost_channel, "reaped"), 10)
    finally:
        stop.set()
        started = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ in ("Worker.serve", "serve")]
        assert len(started) == 3  # the worker, the watchdog and its alert deliverer (runs.alerts.delivery.serve)
        await asyncio.wait(started, timeout=10)
        assert all(t.done() for t in started)
    # database_sync_to_async, not aget: it closes its connection, so the test database can be dropped.
    done = await database_sync_to_async(Run.objects.get)(pk=run.id)
    reaped = await database_sync_to_async(Run.objects.get)(pk=lost.id)
    assert (done.status, done.termination_reason) == ("completed", "completed")
    assert (reaped.status, reaped.termination_reason) == ("failed", "worker_lost")
    assert await database_sync_to_async(lambda: done.step_set.count())() == 1


def _demo_shape(name):
    """The demo feeder's own kwargs for shape `name` (first seed that draws it)."""
    import random

    from runs.agent import demo

    for seed in range(1000):
        drawn, kwargs = demo._shape(random.Random(seed), seed)
        if drawn == name:
            return kwargs
    raise AssertionError(f"no seed draws {name!r}")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_demo_runs_waiting_for_approval_do_not_block_queued_runs(settings, tmp_path):
    # 3 demo "approval wait" runs come first on a worker of 2 slots: they used to take
    # both slots (polling for an answer) and leave the plain runs queued.
    settings.RUNWARDEN_HEARTBEAT_S = 0.05
    settings.RUNWARDEN_CLAIM_POLL_S = 0.05
    settings.RUNWARDEN_WATCHDOG_S = 0.05
    settings.RUNWARDEN_WORKSPACE = tmp_path
    layer = get_channel_layer()
    channel = await layer.new_channel()
    waiting = [await transitions.acreate_run(agent="scripted", **_demo_shape("approval wait")) for _ in range(3)]
    plain = [await transitions.acreate_run(agent="scripted", input={"script": [{"say": "plain run"}]}) for _ in range(2)]
    for run in waiting + plain:
        await layer.group_add(groups.viewers(run.id), channel)
    get = database_sync_to_async(lambda pk: Run.objects.get(pk=pk))

    stop = in_process.start(concurrency=2, with_demo=False)
    try:
        settled, suspended = set(), set()
        while len(settled) < 2 or len(suspended) < 3:  # each run's own event, no polling
            message = await asyncio.wait_for(layer.receive(channel), 20)
            if message.get("event") == "settled":
                settled.add(message["run_id"])
            elif message.get("event") == "suspended":
                suspended.add(message["run_id"])
        assert settled == {str(r.id) for r in plain}  # done while the others wait
        for run in waiting:
            row = await get(run.id)
            assert (row.status, row.worker) == ("waiting_for_approval", "")
        for run in waiting:
            assert await database_sync_to_async(transitions.resume)(run.id, expect="waiting_for_approval", by="op", answer={"approved": True})
        while len(settled) < 5:
            message = await asyncio.wait_for(layer.receive(channel), 20)
            if message.get("event") == "settled":
                settled.add(message["run_id"])
    finally:
        stop.set()
        started = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ in ("Worker.serve", "serve")]
        await asyncio.wait(started, timeout=10)
    for run in waiting:
        row = await get(run.id)
        assert (row.status, row.termination_reason, row.steps) == ("completed", "completed", 3)
