"""The control socket beside the rest of Runwarden: other messages on the run's
control group, the gauge, refusals, revocation, answers and the viewer's resync."""

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from runs import groups, metrics, transitions
from runs.api.auth import revoke_key
from tests.runs.api.test_control import communicator, held

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def gauge():
    return metrics.OPEN_WEBSOCKETS.labels(kind="agent")._value.get()


async def opened(name="sock"):
    client, token, run_id = await held(name)
    socket = communicator(run_id, token)
    connected, _ = await socket.connect()
    assert connected and (await socket.receive_json_from())["type"] == "ready"
    return client, token, run_id, socket


async def test_a_viewers_resync_does_not_kill_the_socket_and_the_next_cancel_arrives():
    _, _, run_id, socket = await opened()
    layer = get_channel_layer()
    reply = await layer.new_channel("viewer.")
    await layer.group_send(groups.control(run_id), {"type": "run.resync", "reply_channel": reply})
    await layer.group_send(groups.control(run_id), {"type": "run.something_new"})
    await socket.send_json_to({"type": "ping"})
    assert await socket.receive_json_from(timeout=2) == {"type": "pong"}  # still open
    await database_sync_to_async(transitions.request_cancel)(run_id, by="alice", source="user")
    assert (await socket.receive_json_from(timeout=2))["type"] == "cancel"
    await socket.disconnect()


async def test_the_gauge_counts_only_open_sockets():
    before = gauge()
    _, _, run_id, socket = await opened()
    assert gauge() == before + 1
    await get_channel_layer().group_send(groups.control(run_id), {"type": "run.resync", "reply_channel": "x"})
    await socket.send_json_to({"type": "ping"})
    await socket.receive_json_from(timeout=2)
    await socket.disconnect()
    assert gauge() == before


async def test_a_refused_socket_gets_a_typed_error_before_the_close():
    _, _, run_id = await held()
    socket = communicator(run_id, None)
    await socket.connect()
    message = await socket.receive_json_from()
    assert message["type"] == "error" and message["error"]["code"] == "unauthorized"
    assert (await socket.receive_output())["code"] == 4401


async def test_an_unknown_client_message_is_answered_and_the_socket_stays():
    _, _, _, socket = await opened()
    await socket.send_json_to({"type": "subscribe"})
    reply = await socket.receive_json_from()
    assert (reply["type"], reply["error"]["code"]) == ("error", "unknown_message")
    await socket.send_json_to({"type": "ping"})
    assert await socket.receive_json_from() == {"type": "pong"}
    await socket.disconnect()


async def test_revoking_the_key_closes_its_socket():
    _, _, _, socket = await opened("revoked-sock")
    assert await database_sync_to_async(revoke_key)("revoked-sock")
    message = await socket.receive_json_from(timeout=2)
    assert (message["type"], message["error"]["code"]) == ("error", "unauthorized")
    assert (await socket.receive_output(timeout=2))["code"] == 4401


async def test_revoking_the_key_ends_its_long_poll():
    import asyncio

    client, _, run_id = await held("revoked-poll")
    poll = asyncio.ensure_future(client.get(f"/api/v1/runs/{run_id}/control?wait=30"))
    await asyncio.wait([poll], timeout=0.3)
    assert not poll.done()
    assert await database_sync_to_async(revoke_key)("revoked-poll")
    response = await asyncio.wait_for(poll, timeout=4)  # the layer wakes it; RECHECK_S is 5
    assert response.status_code == 401


async def test_an_approval_answer_arrives_on_the_socket_and_an_ack_ends_it():
    client, token, run_id, socket = await opened("answered")
    suspend = await client.post(f"/api/v1/runs/{run_id}/suspend", {
        "status": "waiting_for_approval", "request": {"tool": "rm", "args": {"path": "/"}, "call_id": "c1"}})
    assert suspend.status_code == 200
    assert await database_sync_to_async(transitions.resume)(run_id, by="alice", answer={"approved": False, "note": "no"})
    message = await socket.receive_json_from(timeout=2)
    answer = message["input"]
    assert (message["type"], answer["kind"], answer["approved"], answer["note"]) == ("input", "approval", False, "no")
    assert answer["request"] == {"tool": "rm", "args": {"path": "/"}, "call_id": "c1"}
    await socket.send_json_to({"type": "ack", "id": answer["id"]})
    assert await socket.receive_json_from() == {"type": "acked", "id": answer["id"]}
    await socket.disconnect()
    again = communicator(run_id, token)  # a new connection: nothing acknowledged is sent again
    await again.connect()
    assert (await again.receive_json_from())["type"] == "ready"
    assert await again.receive_nothing(timeout=0.2)
    await again.disconnect()


async def test_an_unacknowledged_answer_is_sent_again_on_a_new_socket():
    client, token, run_id, socket = await opened("resent")
    await client.post(f"/api/v1/runs/{run_id}/suspend", {"status": "waiting_for_input", "request": {"prompt": "?"}})
    assert await database_sync_to_async(transitions.resume)(run_id, by="alice", answer={"text": "go on"})
    first = (await socket.receive_json_from(timeout=2))["input"]
    await socket.disconnect()
    again = communicator(run_id, token)
    await again.connect()
    assert (await again.receive_json_from())["type"] == "ready"
    second = (await again.receive_json_from(timeout=2))["input"]
    assert (second["id"], second["kind"], second["text"]) == (first["id"], "message", "go on")
    await again.disconnect()


async def test_the_socket_answers_a_viewers_resync_with_the_text_so_far():
    client, _, run_id, socket = await opened("streamer")
    events = [{"type": "delta", "step": 0, "offset": 0, "text": "Hello "},
              {"type": "delta", "step": 0, "offset": 6, "text": "wörld 😀"}]
    assert (await client.post(f"/api/v1/runs/{run_id}/events", {"events": events})).status_code == 200
    layer = get_channel_layer()
    reply = await layer.new_channel("viewer.")
    await layer.group_send(groups.control(run_id), {"type": "run.resync", "reply_channel": reply})
    snapshot = await layer.receive(reply)
    assert (snapshot["type"], snapshot["step"], snapshot["offset"], snapshot["text"], snapshot["resync"]) == (
        "run.progress", 0, 0, "Hello wörld 😀", True)
    await socket.disconnect()


async def test_a_long_poll_answers_a_viewers_resync_too():
    import asyncio

    client, _, run_id = await held("polling-streamer")
    events = [{"type": "delta", "step": 0, "offset": 0, "text": "polled"}]
    assert (await client.post(f"/api/v1/runs/{run_id}/events", {"events": events})).status_code == 200
    poll = asyncio.ensure_future(client.get(f"/api/v1/runs/{run_id}/control?wait=30"))
    await asyncio.wait([poll], timeout=0.3)
    layer = get_channel_layer()
    reply = await layer.new_channel("viewer.")
    await layer.group_send(groups.control(run_id), {"type": "run.resync", "reply_channel": reply})
    snapshot = await asyncio.wait_for(layer.receive(reply), timeout=4)
    assert (snapshot["text"], snapshot["resync"]) == ("polled", True)
    assert not poll.done()  # the poll goes on waiting for a cancel
    poll.cancel()


async def test_a_ping_finds_a_revocation_whose_message_was_lost(monkeypatch):

    _, _, _, socket = await opened("quietly-revoked")
    monkeypatch.setattr("runs.api.revocation.announce_revoked", lambda ids: None)  # the message is lost
    assert await database_sync_to_async(revoke_key)("quietly-revoked")
    await socket.send_json_to({"type": "ping"})
    message = await socket.receive_json_from(timeout=2)
    assert (message["type"], message["error"]["code"]) == ("error", "unauthorized")
    assert (await socket.receive_output(timeout=2))["code"] == 4401
