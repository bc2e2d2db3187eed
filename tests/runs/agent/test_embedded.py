"""The embedded default: worker and watchdog on the server's own event loop."""

import asyncio
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from runs import groups, transitions
from runs.agent import embedded
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
    assert await transitions.aclaim(lost.id, worker="dead-worker")
    stale = timezone.now() - timedelta(minutes=5)
    await database_sync_to_async(Run.objects.filter(pk=lost.id).update)(heartbeat_at=stale)
    lost_channel = await layer.new_channel()
    await layer.group_add(groups.viewers(lost.id), lost_channel)

    run = await transitions.acreate_run(agent="scripted", input={"script": [{"say": "hello there"}]})
    channel = await layer.new_channel()
    await layer.group_add(groups.viewers(run.id), channel)

    stop = embedded.start(with_demo=False)
    assert embedded.start(with_demo=False) is stop  # once per loop
    try:
        await asyncio.wait_for(until(layer, channel, "settled"), 10)
        await asyncio.wait_for(until(layer, lost_channel, "reaped"), 10)
    finally:
        stop.set()
        started = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ in ("Worker.serve", "serve")]
        assert len(started) == 2  # the worker and the watchdog
        await asyncio.wait(started, timeout=10)
        assert all(t.done() for t in started)
    # database_sync_to_async, not aget: it closes its connection, so the test database can be dropped.
    done = await database_sync_to_async(Run.objects.get)(pk=run.id)
    reaped = await database_sync_to_async(Run.objects.get)(pk=lost.id)
    assert (done.status, done.termination_reason) == ("completed", "completed")
    assert (reaped.status, reaped.termination_reason) == ("failed", "worker_lost")
    assert await database_sync_to_async(lambda: done.step_set.count())() == 1
