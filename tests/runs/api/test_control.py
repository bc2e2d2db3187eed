"""The control channel in-process: the long-poll and the WebSocket, with the real
channel layer of the configuration (in-memory, or Redis pub/sub)."""

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from dashboard.routing import websocket_application
from runs import transitions
from runs.api import control
from runs.api.auth import create_key
from tests.runs.api.conftest import ApiClient
from tests.runs.api.test_events import KeyedAsyncClient

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@database_sync_to_async
def _create_held(name):
    # The sync client in a closing thread: AsyncClient leaves sync views' connections open.
    _, token = create_key(name)
    return token, ApiClient(token).post("/runs", {"agent": "ext", "claim": True}).json()["id"]


async def held(name="poller"):
    token, run_id = await _create_held(name)
    return KeyedAsyncClient(token), token, run_id


async def test_long_poll_answers_at_once_when_a_cancel_is_pending():
    client, _, run_id = await held()
    await database_sync_to_async(transitions.request_cancel)(run_id, by="alice", note="stop", source="dashboard")
    response = await client.get(f"/api/v1/runs/{run_id}/control?wait=30")
    assert response.status_code == 200
    body = response.json()
    assert (body["cancel"]["source"], body["cancel"]["note"], body["held"]) == ("dashboard", "stop", True)


async def test_long_poll_returns_as_soon_as_a_cancel_arrives():
    client, _, run_id = await held()
    poll = asyncio.ensure_future(client.get(f"/api/v1/runs/{run_id}/control?wait=30"))
    await asyncio.wait([poll], timeout=0.3)  # let it subscribe; it must still be waiting
    assert not poll.done()
    started = time.perf_counter()
    await database_sync_to_async(transitions.request_cancel)(run_id, by="alice", source="api")
    response = await asyncio.wait_for(poll, timeout=5)
    assert response.status_code == 200 and response.json()["cancel"]["source"] == "api"
    # The wake-up comes from the layer, well before the database re-check would.
    assert time.perf_counter() - started < control.RECHECK_S / 2


async def test_long_poll_is_empty_at_the_timeout():
    client, _, run_id = await held()
    started = time.perf_counter()
    response = await client.get(f"/api/v1/runs/{run_id}/control?wait=0.2")
    assert response.status_code == 204 and response.content == b""
    assert time.perf_counter() - started >= 0.2  # it waited; an upper bound would be a timing test


async def test_long_poll_wait_is_capped(monkeypatch):
    client, _, run_id = await held()
    monkeypatch.setattr(control, "MAX_WAIT_S", 0.1)
    response = await asyncio.wait_for(client.get(f"/api/v1/runs/{run_id}/control?wait=100000"), timeout=5)
    assert response.status_code == 204


async def test_long_poll_reports_a_run_that_ended_under_it():
    client, _, run_id = await held()
    await database_sync_to_async(transitions.retire)(run_id, by="alice")
    body = (await client.get(f"/api/v1/runs/{run_id}/control?wait=30")).json()
    assert (body["status"], body["held"]) == ("cancelled", False)


def communicator(run_id, token=None):
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    # No Origin header: agents are not browsers, and this route is outside the Origin check.
    return WebsocketCommunicator(websocket_application, f"/ws/agent/runs/{run_id}/", headers=headers)


async def test_websocket_delivers_a_cancel_the_moment_it_is_requested():
    _, token, run_id = await held()
    socket = communicator(run_id, token)
    connected, _ = await socket.connect()
    assert connected
    assert await socket.receive_json_from() == {"type": "ready", "run_id": run_id, "status": "running"}
    await database_sync_to_async(transitions.request_cancel)(run_id, by="alice", note="enough", source="dashboard")
    assert await socket.receive_json_from(timeout=2) == {"type": "cancel", "source": "dashboard", "note": "enough"}
    await database_sync_to_async(transitions.retire)(run_id, by="alice")
    assert await socket.receive_nothing(timeout=0.2)  # one cancel, once
    await socket.send_json_to({"type": "ping"})
    assert await socket.receive_json_from() == {"type": "pong"}
    await socket.disconnect()


async def test_websocket_delivers_the_escalation_of_an_ignored_cancel_as_a_hard_stop():
    _, token, run_id = await held()
    socket = communicator(run_id, token)
    await socket.connect()
    assert (await socket.receive_json_from())["type"] == "ready"
    await database_sync_to_async(transitions.request_cancel)(run_id, by="alice", source="dashboard")
    assert (await socket.receive_json_from(timeout=2)).get("hard") is None
    assert await database_sync_to_async(transitions.escalate_cancel)(run_id)
    assert await socket.receive_json_from(timeout=2) == {
        "type": "cancel", "hard": True, "source": "watchdog", "note": "cancel not honoured: stop now",
    }
    await socket.disconnect()


async def test_websocket_sends_a_cancel_that_was_pending_before_it_connected():
    _, token, run_id = await held()
    await database_sync_to_async(transitions.request_cancel)(run_id, by="alice", source="cli")
    socket = communicator(run_id, token)
    await socket.connect()
    assert (await socket.receive_json_from())["type"] == "ready"
    assert (await socket.receive_json_from())["type"] == "cancel"
    await socket.disconnect()


@pytest.mark.parametrize("case,code", [("no key", 4401), ("bad key", 4401), ("not yours", 4403), ("no run", 4404)])
async def test_websocket_refuses_with_a_reason(case, code):
    _, token, run_id = await held()
    _, other = await database_sync_to_async(create_key)("intruder")
    run, key = {
        "no key": (run_id, None), "bad key": (run_id, "rw_" + "x" * 43),
        "not yours": (run_id, other), "no run": ("00000000-0000-0000-0000-000000000000", token),
    }[case]
    socket = communicator(run, key)
    connected, _ = await socket.connect()
    assert connected
    message = await socket.receive_json_from()
    assert message["error"]["code"] in {"unauthorized", "not_your_run", "run_not_found"}
    assert (await socket.receive_output())["code"] == code
