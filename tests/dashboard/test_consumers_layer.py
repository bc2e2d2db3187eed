"""A page that may have missed messages says so, and resyncs when the layer is back:
each socket checks the channel layer end to end with a probe sent to itself."""

import pytest
from channels.layers import get_channel_layer

from dashboard import consumers
from tests.dashboard.test_consumers import connected, frame_with, running_run

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def flaky_layer(monkeypatch):
    """The layer loses every probe while `state["down"]` (as a Redis outage would)."""
    monkeypatch.setattr(consumers, "HEARTBEAT_REFRESH_S", 60)
    monkeypatch.setattr(consumers, "PROBE_EVERY_S", 0.1)
    monkeypatch.setattr(consumers, "STALE_AFTER_S", 0.4)
    layer, state = get_channel_layer(), {"down": False}
    send = layer.send

    async def lossy_send(channel, message):
        if state["down"] and message.get("type") == "layer.probe":
            raise ConnectionError("layer away")
        return await send(channel, message)

    monkeypatch.setattr(layer, "send", lossy_send)
    return state


@pytest.mark.parametrize("path", ["/ws/runs/", "detail"])
async def test_a_silent_layer_marks_the_page_stale_and_its_return_asks_for_a_resync(operator, flaky_layer, path):
    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/" if path == "detail" else path, operator)
    assert await ws.receive_nothing(timeout=0.6)  # probes come back: nothing to say
    flaky_layer["down"] = True
    text = await frame_with(ws, 'id="live-state"')
    assert 'data-state="stale"' in text and "updates may be missing" in text
    flaky_layer["down"] = False
    closed = await ws.receive_output(timeout=3)
    # 1012: the page reconnects with its cursor and catches up from the database.
    assert closed["type"] == "websocket.close" and closed["code"] == consumers.CLOSE_RESYNC
