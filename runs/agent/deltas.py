"""The data plane: every run's deltas, out to its viewers, in batches. Best effort.

Each run's `Progress` only marks itself pending; one flusher per worker wakes at most
`hz` times a second, takes from every pending run ONE message holding all the text that
run streamed since its last one (offsets kept: coalesced at the source), and publishes
the whole batch in one go: one pipelined round trip on the Redis pub/sub layer, however
many runs. So there is at most one publish in flight per worker and one message per run
per batch; when Redis lags, text piles up in the runs (where it is anyway) and leaves
as fewer, longer messages. Nothing queues without bound.

A batch that fails or times out is dropped and logged (once per FAILURE_LOG_EVERY_S):
the next message of each run starts past what its viewers hold, so they see the gap and
ask for a resync (answered from `Progress.snapshot()`). Failures here never touch the
control plane (`runs.agent.control`): a cancel does not wait for a delta.
"""

import asyncio
import logging
import time

from runs import groups
from runs.agent.control import _redis_settings, group_channel
from runs.agent.fastpath import FastPath

log = logging.getLogger(__name__)

BATCH_TIMEOUT_S = 2.0
FAILURE_LOG_EVERY_S = 30.0


class DeltaPublisher:
    """`publisher.pending(progress)`: that run has something to send; `send(channel,
    message)`: one message to one channel (a resync's answer), in the next batch."""

    def __init__(self, layer, *, hz=10.0, timeout_s=BATCH_TIMEOUT_S, sink=None):
        self.interval = 1.0 / hz if hz > 0 else 0.0
        self.timeout_s = timeout_s
        self._sink = sink if sink is not None else _sink_for(layer)
        self._pending = {}  # Progress -> None, in the order they became pending
        self._direct = []  # (channel, message, False): sent as they are, not to a group
        self._flusher = None
        self._attached = set()  # Progress of the runs going on
        self._failures, self._logged_at = 0, 0.0
        self.batches = 0  # published; tests and benchmarks read them
        self.messages = 0

    @property
    def enabled(self):
        return self._sink is not None

    def pending(self, progress):
        if self._sink is None:
            return
        self._pending[progress] = None
        self._kick()

    def send(self, channel, message):
        if self._sink is None:
            return
        self._direct.append((channel, message, False))
        self._kick()

    def attach(self, progress):
        self._attached.add(progress)

    def detach(self, progress):
        """The run is over: whatever it has pending still goes in the next batch."""
        self._attached.discard(progress)

    async def close(self):
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
        await self._sink.close() if self._sink is not None else None

    def _kick(self):
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_loop())

    async def _flush_loop(self):
        # Runs while there is something to send, then ends (restarted by the next
        # delta; a test leaves no task behind).
        while True:
            while self._pending or self._direct:
                started = time.monotonic()
                batch = self._take()
                if batch:
                    await self._publish(batch)
                # The rate limit itself (a clock, not a wait for an event): batches at
                # most `hz` a second, so each run sends at most `hz` messages a second.
                rest = self.interval - (time.monotonic() - started)
                if rest > 0:
                    await asyncio.sleep(rest)
            if not self._attached:  # no run left: let the connection go too
                await self._sink.reset()
            if not (self._pending or self._direct):  # nothing came in meanwhile
                return

    def _take(self):
        pending, self._pending = self._pending, {}
        batch, self._direct = self._direct, []
        for progress in pending:
            batch += [(groups.viewers(progress.run_id), message, True) for message in progress.take()]
        return batch

    async def _publish(self, batch):
        try:
            await asyncio.wait_for(self._sink.publish(batch), self.timeout_s)
            self.batches += 1
            self.messages += len(batch)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - viewers resync; the engine never waits on this
            self._failures += 1
            now = time.monotonic()
            if now - self._logged_at >= FAILURE_LOG_EVERY_S:
                log.warning(
                    "live deltas dropped (%d batch(es) since last report): %s: %s; viewers resync",
                    self._failures, type(error).__name__, error,
                )
                self._failures, self._logged_at = 0, now
            await self._sink.reset()


def _sink_for(layer):
    if layer is None:
        return None
    redis = _redis_settings(layer)
    if redis is not None:
        return RedisSink(layer, *redis)
    return LayerSink(layer)


class RedisSink:
    """One connection of its own, one pipelined round trip per batch (no transaction:
    the PUBLISHes are independent), names and encoding as the pub/sub layer makes them."""

    def __init__(self, layer, host, prefix):
        self.layer, self.host, self.prefix = layer, host, prefix
        self._client = None

    async def publish(self, batch):
        if self._client is None:
            from channels_redis.utils import create_pool
            from redis import asyncio as aioredis

            self._client = aioredis.Redis(connection_pool=create_pool(self.host))
        pipe = self._client.pipeline(transaction=False)
        for name, message, is_group in batch:
            pipe.publish(group_channel(self.prefix, name) if is_group else name, self.layer.serialize(message))
        await pipe.execute()

    async def reset(self):
        """After a failure or a timeout the connection may be mid-reply: start afresh."""
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose(close_connection_pool=True)
            except Exception:  # noqa: BLE001 - it is being thrown away
                pass

    async def close(self):
        await self.reset()


class LayerSink:
    """Any other layer: its own FastPath (its failures are its own), message by message."""

    def __init__(self, layer):
        self.fastpath = FastPath(layer)

    async def publish(self, batch):
        for name, message, is_group in batch:
            if is_group:
                await self.fastpath.group_send(name, message)
            else:
                await self.fastpath.send(name, message)

    async def reset(self):
        pass

    async def close(self):
        pass
