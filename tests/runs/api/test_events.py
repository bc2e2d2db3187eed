"""POST /runs/{id}/events: relayed to live viewers, coalesced."""

import json

import pytest
from channels.db import database_sync_to_async as sync_to_async
from channels.layers import get_channel_layer
from django.test import AsyncClient

from runs import groups, transitions
from runs.api.auth import create_key
from runs.api.relay import coalesce
from runs.api.schemas import EventsIn
from tests.runs.api.conftest import ApiClient


def batch(*events):
    return EventsIn(events=list(events)).events


def delta(step, offset, text):
    return {"type": "delta", "step": step, "offset": offset, "text": text}


def test_contiguous_deltas_of_a_step_become_one_message():
    messages = coalesce("r1", batch(delta(0, 0, "Hel"), delta(0, 3, "lo"), delta(0, 5, "!")))
    assert messages == [{"type": "run.progress", "run_id": "r1", "step": 0, "offset": 0, "text": "Hello!", "tools": []}]


def test_a_gap_or_a_new_step_starts_a_new_message():
    messages = coalesce("r1", batch(delta(0, 0, "ab"), delta(0, 5, "xy"), delta(1, 0, "c"), delta(0, 7, "z")))
    assert [(m["step"], m["offset"], m["text"]) for m in messages] == [(0, 0, "ab"), (0, 5, "xyz"), (1, 0, "c")]


def test_tool_events_ride_along_with_the_latest_state_per_tool():
    started = {"type": "tool", "step": 2, "id": "c1", "name": "search", "state": "started", "args": {"q": "x"}}
    finished = {**started, "state": "finished", "result": "ok"}
    (message,) = coalesce("r1", batch(started, delta(2, 0, "hi"), finished))
    assert (message["offset"], message["text"]) == (0, "hi")
    assert [(t["id"], t["state"], t["result"]) for t in message["tools"]] == [("c1", "finished", "ok")]


@sync_to_async
def _create_held(name):
    # The sync client in a closing thread: AsyncClient leaves sync views' connections open.
    _, token = create_key(name)
    return token, ApiClient(token).post("/runs", {"agent": "ts", "claim": True}).json()["id"]


class KeyedAsyncClient:
    """AsyncClient drops client-wide headers from the ASGI scope: send them per request."""

    def __init__(self, token):
        self.client, self.headers = AsyncClient(), {"Authorization": f"Bearer {token}"}

    async def post(self, path, data, content_type="application/json"):
        return await self.client.post(path, data, content_type=content_type, headers=self.headers)

    async def get(self, path):
        return await self.client.get(path, headers=self.headers)


async def _viewer(run_id):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(groups.viewers(run_id), channel)
    return layer, channel


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_batch_reaches_live_viewers_coalesced():
    token, run_id = await _create_held("streamer")
    client = KeyedAsyncClient(token)
    layer, channel = await _viewer(run_id)
    events = [delta(0, i, "x") for i in range(500)]
    response = await client.post(f"/api/v1/runs/{run_id}/events", json.dumps({"events": events}), content_type="application/json")
    assert response.status_code == 200
    assert response.json() == {"accepted": 500, "relayed": 1, "cancel_requested": False, "stop_reason": None}
    message = await layer.receive(channel)
    assert (message["type"], message["run_id"], message["text"]) == ("run.progress", run_id, "x" * 500)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_events_tell_the_agent_a_cancel_is_pending_and_stop_after_the_run_ends():
    token, run_id = await _create_held("streamer")
    client = KeyedAsyncClient(token)
    body = json.dumps({"events": [delta(0, 0, "x")]})
    await sync_to_async(transitions.request_cancel)(run_id, by="alice")
    response = await client.post(f"/api/v1/runs/{run_id}/events", body, content_type="application/json")
    assert response.json()["cancel_requested"] is True
    await sync_to_async(transitions.retire)(run_id, by="alice")
    response = await client.post(f"/api/v1/runs/{run_id}/events", body, content_type="application/json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "run_ended"
    assert response.json()["status"] == "cancelled"


def _make_stale(run_id):
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Run

    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now() - timedelta(minutes=5))


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_batch_counts_as_a_heartbeat_so_a_streaming_agent_is_not_reaped():
    from datetime import timedelta

    token, run_id = await _create_held("streamer")
    await sync_to_async(_make_stale)(run_id)
    response = await KeyedAsyncClient(token).post(
        f"/api/v1/runs/{run_id}/events", json.dumps({"events": [delta(0, 0, "x")]}), content_type="application/json"
    )
    assert response.status_code == 200
    assert await sync_to_async(transitions.reap_stale)(older_than=timedelta(minutes=1)) == []
