"""Changes are announced after commit, over the configured channel layer."""

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from runs import groups, transitions

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def listen(*group_names):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    for name in group_names:
        await layer.group_add(name, channel)
    return layer, channel


async def test_cancel_request_reaches_viewers_list_and_the_executor():
    run = await transitions.acreate_run(agent="scripted")
    assert await database_sync_to_async(transitions.claim)(run.id, worker="w1")
    layer, viewer = await listen(groups.viewers(run.id))
    _, executor = await listen(groups.control(run.id))
    _, lister = await listen(groups.LIST_GROUP)

    await database_sync_to_async(transitions.request_cancel)(run.id, by="alice", note="enough")

    changed = await asyncio.wait_for(layer.receive(viewer), 2)
    assert (changed["type"], changed["event"], changed["run_id"]) == ("run.changed", "cancel_requested", str(run.id))
    assert (await asyncio.wait_for(layer.receive(lister), 2))["event"] == "cancel_requested"
    cancel = await asyncio.wait_for(layer.receive(executor), 2)
    assert cancel == {"type": "run.cancel", "run_id": str(run.id), "source": "dashboard", "note": "enough"}


async def test_nothing_is_announced_for_a_rolled_back_change():
    run = await transitions.acreate_run(agent="scripted")
    layer, viewer = await listen(groups.viewers(run.id))

    def settle_then_roll_back():
        try:
            with transaction.atomic():
                transitions.claim(run.id, worker="w1")
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        transitions.claim(run.id, worker="w2")  # the one that commits

    from channels.db import database_sync_to_async

    await database_sync_to_async(settle_then_roll_back)()
    first = await asyncio.wait_for(layer.receive(viewer), 2)
    assert (first["event"], first["seq"]) == ("claimed", 2)  # the rolled-back claim never showed
