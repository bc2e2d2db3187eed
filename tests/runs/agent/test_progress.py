"""Deltas to viewers: coalesced, contiguous by offset, and a resync on request."""

import asyncio
import time

import pytest
from channels.layers import get_channel_layer

from runs import groups
from runs.agent.cancel import CancelSignal
from runs.agent.progress import Progress
from runs.agent.runner import execute

pytestmark = pytest.mark.asyncio


class Captured:
    def __init__(self):
        self.sent = []

    async def group_send(self, group, message):
        self.sent.append((time.monotonic(), group, message))
        return True


async def test_deltas_are_coalesced_to_ten_a_second_and_contiguous():
    fastpath = Captured()
    progress = Progress("r1", fastpath, hz=10)
    progress.start(3)
    text = ""
    started = time.monotonic()
    for i in range(100):  # a fast stream: 100 chunks in about 0.5 s
        chunk = f"w{i} "
        text += chunk
        progress.append(chunk)
        await asyncio.sleep(0.005)
    progress.flush()
    await asyncio.sleep(0)
    elapsed = time.monotonic() - started
    messages = [m for _, _, m in fastpath.sent]
    assert len(messages) <= elapsed * 10 + 2  # at most ~10 per second
    assert len(messages) >= 3  # but it does stream, not one lump at the end
    assert {g for _, g, _ in fastpath.sent} == {groups.viewers("r1")}
    offset = 0
    for message in messages:
        assert (message["type"], message["step"], message["offset"]) == ("run.progress", 3, offset)
        offset += len(message["text"])
    assert "".join(m["text"] for m in messages) == text
    await progress.close()


async def test_tool_states_ride_on_the_deltas():
    fastpath = Captured()
    progress = Progress("r1", fastpath, hz=1000)
    progress.start(0)
    progress.tool("c1", "sleep", "running")
    await asyncio.sleep(0.01)
    progress.tool("c1", "sleep", "done")
    progress.flush()
    await asyncio.sleep(0)
    tools = [m["tools"] for _, _, m in fastpath.sent if "tools" in m]
    assert tools[0] == [{"id": "c1", "name": "sleep", "state": "running"}]
    assert tools[-1] == [{"id": "c1", "name": "sleep", "state": "done"}]
    await progress.close()


@pytest.mark.django_db(transaction=True)
async def test_a_resync_request_gets_the_whole_in_flight_text(ctx, claimed):
    layer = get_channel_layer()
    run = await claimed(script=[{"say": " ".join(f"w{i}" for i in range(400)), "token_delay_ms": 2}])
    viewer = await layer.new_channel()
    await layer.group_add(groups.viewers(run.id), viewer)
    signal = CancelSignal()
    task = asyncio.ensure_future(execute(run, signal=signal, ctx=ctx))
    seen = ""
    for _ in range(3):  # streaming has begun: a viewer holds some text
        message = await asyncio.wait_for(layer.receive(viewer), 5)
        assert message["offset"] == len(seen)
        seen += message["text"]
    reply_to = await layer.new_channel()
    await layer.group_send(groups.control(run.id), {"type": "run.resync", "reply_channel": reply_to})
    snapshot = await asyncio.wait_for(layer.receive(reply_to), 5)
    signal.cancel()
    await task
    assert (snapshot["type"], snapshot["offset"], snapshot["resync"], snapshot["step"]) == ("run.progress", 0, True, 0)
    assert snapshot["text"].startswith(seen) and seen.startswith("w0 w1")


async def test_between_steps_a_resync_holds_no_committed_text():
    fastpath = Captured()
    progress = Progress("r1", fastpath, hz=1000, step=2)
    assert (progress.snapshot()["step"], progress.snapshot()["text"]) == (2, "")
    progress.start(2)
    progress.append("hello")
    progress.flush()
    progress.committed(2)  # in the database now: a resync must not hand it out again
    assert (progress.snapshot()["step"], progress.snapshot()["text"], progress.snapshot()["offset"]) == (3, "", 0)
    await progress.close()
