"""The channel-layer messages: one definition each, one tool-state vocabulary, and the
transition (not a list of event kinds) deciding whether the worker is told."""

import asyncio
import typing

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from runs import events, groups, messages, transitions
from runs.api import schemas
from tests.conftest import claim_new_run


def test_the_agent_api_accepts_exactly_the_one_tool_state_vocabulary():
    (field,) = [f for name, f in schemas.ToolEvent.model_fields.items() if name == "state"]
    assert typing.get_args(field.annotation) == messages.TOOL_STATES == ("started", "finished", "failed")


def test_a_tool_state_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="unknown tool state 'done'"):
        messages.tool("c1", "echo", "done")
    assert messages.tool("c1", "echo", "finished", result=1) == {
        "id": "c1", "name": "echo", "state": "finished", "result": 1,
    }


async def listen(group):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return layer, channel


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_timeline_entry_that_only_looks_like_a_cancel_tells_the_worker_nothing():
    run = await database_sync_to_async(claim_new_run)()
    layer, viewer = await listen(groups.viewers(run.id))
    _, executor = await listen(groups.control(run.id))
    await database_sync_to_async(events.append)(run.id, "cancel_requested", note="not a transition")
    assert (await asyncio.wait_for(layer.receive(viewer), 2))["event"] == "cancel_requested"
    # The worker's message would have gone first (control, then viewers): nothing came.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(layer.receive(executor), 0.2)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_retire_and_escalation_tell_the_worker_through_their_transitions():
    run = await database_sync_to_async(claim_new_run)()
    layer, executor = await listen(groups.control(run.id))
    await database_sync_to_async(transitions.request_cancel)(run.id, by="op", note="stop")
    assert await asyncio.wait_for(layer.receive(executor), 2) == {
        "type": "run.cancel", "run_id": str(run.id), "source": "dashboard", "note": "stop",
    }
    assert await database_sync_to_async(transitions.escalate_cancel)(run.id)
    assert (await asyncio.wait_for(layer.receive(executor), 2))["hard"] is True
    assert await database_sync_to_async(transitions.retire)(run.id, by="op")
    retired = await asyncio.wait_for(layer.receive(executor), 2)
    assert (retired["type"], retired.get("hard")) == ("run.cancel", None)
