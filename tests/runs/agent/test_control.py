"""The control plane: a cancel reaches its run while the data plane is stalled or
failing, on a connection of its own; a dropped connection comes back by itself.

On the PostgreSQL + Redis pass the control path is the real one (RedisControl on
Redis, the cancel published by request_cancel's own broadcast); only the *publisher*
of deltas is a stand-in, stalled on an event that is never set.
"""

import asyncio
import dataclasses

import pytest
from channels.layers import InMemoryChannelLayer, get_channel_layer

from runs import groups, transitions
from runs.agent.cancel import CancelSignal
from runs.agent.control import LayerControl, RedisControl, control_for
from runs.agent.deltas import DeltaPublisher
from runs.agent.runner import RunState, execute
from tests.runs.agent.conftest import say, wait_for

pytestmark = [pytest.mark.asyncio]


class StalledSink:
    """Delta publishing that never completes (`hang`) or always fails (`fail`)."""

    def __init__(self, mode):
        self.mode, self.calls, self.entered = mode, 0, asyncio.Event()
        self.never = asyncio.Event()

    async def publish(self, batch):
        self.calls += 1
        self.entered.set()
        if self.mode == "fail":
            raise ConnectionError("Redis said no")
        await self.never.wait()

    async def reset(self):
        pass

    async def close(self):
        pass


async def cancel_over_the_channel(pool, run_id):
    """request_cancel as the dashboard makes it; with the in-memory layer its broadcast
    from a pool thread has no loop to land on, so the test sends what it would send."""
    assert await pool.call(transitions.request_cancel, run_id, by="op") == transitions.CancelOutcome.REQUESTED
    layer = get_channel_layer()
    if isinstance(layer, InMemoryChannelLayer):
        await layer.group_send(groups.control(run_id), {"type": "run.cancel", "run_id": str(run_id)})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["hang", "fail"])
async def test_a_cancel_reaches_the_run_while_delta_publishing_is_stalled(ctx, claimed, fetch, pool, mode):
    # No heartbeat inside the test's time: only the control plane can deliver the cancel.
    ctx.config = dataclasses.replace(ctx.config, heartbeat_s=60)
    sink = StalledSink(mode)
    ctx.deltas = DeltaPublisher(None, hz=100, sink=sink, timeout_s=60 if mode == "hang" else 0.01)
    run = await claimed(script=[say(2000, 5)])
    state = RunState(run.id, CancelSignal())
    task = asyncio.ensure_future(execute(run, signal=state.signal, ctx=ctx, state=state))
    await asyncio.wait_for(sink.entered.wait(), 10)  # the data plane is stuck (or failing) now
    if mode == "fail":
        await asyncio.wait_for(wait_for(lambda: sink.calls >= 3), 10)
    await cancel_over_the_channel(pool, run.id)
    await asyncio.wait_for(task, 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, steps) == ("cancelled", "cancelled", [])
    assert state.cancel_via == "channel"
    assert not task.cancelled()


@pytest.mark.django_db(transaction=True)
async def test_control_and_deltas_never_share_a_connection_or_a_failure_state(ctx, claimed):
    ctx.planes()
    layer = get_channel_layer()
    if isinstance(layer, InMemoryChannelLayer):
        assert isinstance(ctx.control, LayerControl)
        assert ctx.control.fastpath is not ctx.fastpath  # a failed send there never marks this down
    else:
        assert isinstance(ctx.control, RedisControl)
    assert ctx.deltas._sink is not None and getattr(ctx.deltas._sink, "fastpath", None) is not getattr(
        ctx.control, "fastpath", object()
    )


async def test_without_a_layer_listen_says_so_and_nothing_is_left_running():
    control = control_for(None)
    assert await control.listen("r1", lambda m: None) is False
    control.forget("r1")
    await control.close()


class Proxy:
    """A loopback TCP proxy to Redis that the test can cut (every open connection
    closed at once), as a Redis restart or a network blip would."""

    def __init__(self, target_host, target_port):
        self.target = (target_host, target_port)
        self.pairs = []

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader, writer):
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.pairs.append((writer, up_writer))

        async def pipe(src, dst):
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self):
        for client, upstream in self.pairs:
            client.transport.abort()
            upstream.transport.abort()
        self.pairs = []

    async def close(self):
        self.cut()
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
def redis_layer():
    layer = get_channel_layer()
    if isinstance(layer, InMemoryChannelLayer):
        pytest.skip("needs Redis: set REDIS_URL")
    return layer


async def test_the_control_plane_comes_back_by_itself_after_its_connection_drops(redis_layer):
    from urllib.parse import urlparse

    url = urlparse(redis_layer._kwargs["hosts"][0])
    proxy = await Proxy(url.hostname, url.port or 6379).start()
    control = RedisControl(redis_layer, {"address": f"redis://127.0.0.1:{proxy.port}/0"}, redis_layer._kwargs["prefix"])
    heard = []
    arrived = asyncio.Event()

    def handler(message):
        heard.append(message["n"])
        arrived.set()

    try:
        assert await control.listen("r1", handler)
        await redis_layer.group_send(groups.control("r1"), {"type": "run.cancel", "n": 1})
        await asyncio.wait_for(arrived.wait(), 5)
        connected_at = control.connected_at
        proxy.cut()  # Redis "restarts": the reader sees its socket die
        await asyncio.wait_for(wait_for(lambda: control.connected_at > connected_at, timeout=15), 20)
        arrived.clear()
        # Re-subscribed on the new connection: the next cancel is heard again.
        await redis_layer.group_send(groups.control("r1"), {"type": "run.cancel", "n": 2})
        await asyncio.wait_for(arrived.wait(), 5)
        assert heard == [1, 2]
    finally:
        control.forget("r1")
        await control.close()
        await proxy.close()


async def test_a_forgotten_run_hears_nothing_more(redis_layer):
    control = control_for(redis_layer)
    heard, arrived = [], asyncio.Event()
    assert await control.listen("r1", lambda m: heard.append(("r1", m["n"])))
    assert await control.listen("r2", lambda m: (heard.append(("r2", m["n"])), arrived.set()))
    control.forget("r1")  # its slot's signal may be re-armed for another run right after
    await redis_layer.group_send(groups.control("r1"), {"type": "run.cancel", "n": 1})
    await redis_layer.group_send(groups.control("r2"), {"type": "run.cancel", "n": 2})
    await asyncio.wait_for(arrived.wait(), 5)  # Redis keeps order: r1's message came first
    assert heard == [("r2", 2)]
    control.forget("r2")
    await control.close()
