"""The control plane: cancels (and resync requests) in, apart from the deltas going out.

A cancel must reach its run's CancelSignal without waiting behind anything else the
worker sends, so control never shares a connection, a lock or a failure state with the
data plane (`runs.agent.deltas`):

- `RedisControl` (the Redis pub/sub layer): ONE pub/sub connection of its own for the
  whole worker, subscribed to every held run's control group (`SUBSCRIBE` is cheap in
  Redis; 500 of them are 500 names on one socket), and one reader task that hands each
  message straight to its run's handler, no queue in between. The channel name says
  which run a message is for, so messages need not carry a run id. When the
  connection drops the reader reconnects by itself with backoff and re-subscribes
  every held run in one command; meanwhile the heartbeat's answer carries cancels.
- `LayerControl` (any other layer, e.g. in-memory when embedded): a subscription per
  run through the layer's own groups, on a FastPath of its own, so a failure of the
  data plane's FastPath never marks this one down.

`await control.listen(run_id, handler)` returns once Redis has confirmed the
subscription (True), so a cancel requested after it is heard; a cancel requested
before it is in the row, which the caller reads next. False at once when the layer is
known to be down (the run is subscribed when it comes back), or after SUBSCRIBE_WAIT_S.
`control.forget(run_id)` is synchronous for the handler: after it no message of that
run reaches it.
"""

import asyncio
import inspect
import logging
import time

from runs import groups
from runs.agent.fastpath import FastPath

log = logging.getLogger(__name__)

SUBSCRIBE_WAIT_S = 2.0
RECONNECT_MAX_S = 5.0


def control_for(layer, *, worker_id="worker"):
    """The control plane for `layer` (None: no fast path at all)."""
    if layer is None:
        return LayerControl(None)
    redis = _redis_settings(layer)
    if redis is not None:
        return RedisControl(layer, *redis, worker_id=worker_id)
    return LayerControl(layer)


def _redis_settings(layer):
    """(host, prefix) when `layer` is channels_redis's pub/sub layer on one host."""
    try:
        from channels_redis.pubsub import RedisPubSubChannelLayer
        from channels_redis.utils import decode_hosts
    except ImportError:  # pragma: no cover - channels_redis is a dependency
        return None
    if not isinstance(layer, RedisPubSubChannelLayer):
        return None
    hosts = decode_hosts(layer._kwargs.get("hosts"))
    if len(hosts) != 1:  # sharded: the layer picks a host per name; leave that to it
        return None
    return hosts[0], layer._kwargs.get("prefix", "asgi")


def group_channel(prefix, group):
    """The Redis channel the pub/sub layer publishes a group's messages on."""
    return f"{prefix}__group__{group}"


def _dispatch(handler, message, what):
    """Call the handler; an awaitable it returns runs as a task of its own, so the
    reader is never held up by the reply to a resync."""
    try:
        result = handler(message)
        if inspect.isawaitable(result):
            asyncio.ensure_future(result)
    except Exception:  # noqa: BLE001 - one bad message must not end the reader
        log.exception("control handler failed for %s", what)


class RedisControl:
    def __init__(self, layer, host, prefix, *, worker_id="worker"):
        self.layer = layer  # for its serializer: what the dashboard's group_send wrote
        self.host, self.prefix = host, prefix
        # A channel only this worker listens on, so the connection is always subscribed
        # to something and the reader has a confirmation to wait for after connecting.
        self._own = f"{prefix}__control__{worker_id}"
        self._handlers = {}  # Redis channel -> handler
        self._confirmed = {}  # Redis channel -> future set when Redis confirms SUBSCRIBE
        self._pubsub = None
        self._connected = asyncio.Event()
        self._reader = None
        self._down = False  # the last connection attempt failed; the reader retries
        self.connected_at = 0.0  # monotonic; tests and logs read it

    @property
    def available(self):
        return self._connected.is_set()

    async def listen(self, run_id, handler):
        channel = group_channel(self.prefix, groups.control(run_id))
        self._handlers[channel] = handler
        self._ensure_reader()
        if self._down:  # known down: no run waits on it; the reader subscribes it once back
            return False
        confirmed = self._confirmed[channel] = asyncio.get_running_loop().create_future()
        if self._connected.is_set():
            try:
                await self._pubsub.subscribe(channel)
            except Exception as error:  # noqa: BLE001 - the reader reconnects and re-subscribes
                log.warning("control subscribe failed (%s); the reader reconnects", error)
        # Not connected: the reader subscribes every held run once it is (re)connected.
        try:
            await asyncio.wait_for(asyncio.shield(confirmed), SUBSCRIBE_WAIT_S)
            return True
        except asyncio.TimeoutError:
            return False

    def forget(self, run_id):
        channel = group_channel(self.prefix, groups.control(run_id))
        self._handlers.pop(channel, None)
        self._confirmed.pop(channel, None)
        if not self._handlers and self._reader is not None:
            # Nothing left to listen for: let the connection go (a worker reconnects
            # on its next run; a test leaves no task behind).
            self._reader.cancel()
            self._reader = None
        elif self._connected.is_set() and self._pubsub is not None:
            asyncio.ensure_future(self._unsubscribe(self._pubsub, channel))

    async def close(self):
        self._handlers.clear()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _unsubscribe(self, pubsub, channel):
        try:
            await pubsub.unsubscribe(channel)
        except Exception:  # noqa: BLE001 - a dead connection unsubscribes everything anyway
            pass

    def _ensure_reader(self):
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read())

    async def _read(self):
        from redis import asyncio as aioredis
        from channels_redis.utils import create_pool

        backoff = 0.05
        while True:
            client = aioredis.Redis(connection_pool=create_pool(self.host))
            pubsub = client.pubsub()
            try:
                held = set(self._handlers)
                await asyncio.wait_for(pubsub.subscribe(self._own, *held), SUBSCRIBE_WAIT_S)
                self._pubsub = pubsub
                self._connected.set()
                self._down = False
                if set(self._handlers) - held:  # runs that started while we connected
                    await pubsub.subscribe(*(set(self._handlers) - held))
                self.connected_at = time.monotonic()
                if backoff > 0.05:
                    log.info("control plane reconnected (%d runs)", len(self._handlers))
                backoff = 0.05
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._on_message(message)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - reconnect; heartbeats carry cancels meanwhile
                self._down = True
                if self._connected.is_set() or backoff == 0.05:
                    log.warning("control plane unavailable (%s: %s); relying on heartbeats", type(error).__name__, error)
            finally:
                if self._pubsub in (pubsub, None):  # not a newer reader's connection
                    self._connected.clear()
                    self._pubsub = None
                await _close_quietly(pubsub, client)
            await asyncio.sleep(backoff)  # a clock between reconnects, not a wait for an event
            backoff = min(RECONNECT_MAX_S, backoff * 4)

    def _on_message(self, message):
        kind, channel = message.get("type"), message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode()
        if kind == "subscribe":
            confirmed = self._confirmed.pop(channel, None)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(True)
            return
        if kind != "message":
            return
        handler = self._handlers.get(channel)
        if handler is None:  # a run just forgotten, or our own channel
            return
        try:
            payload = self.layer.deserialize(message["data"])
        except Exception:  # noqa: BLE001 - not ours to read; ignore it
            log.warning("control message on %s could not be read", channel)
            return
        _dispatch(handler, payload, channel)


async def _close_quietly(pubsub, client):
    try:
        await pubsub.aclose()
        await client.aclose(close_connection_pool=True)
    except Exception:  # noqa: BLE001 - it is being thrown away
        pass


class LayerControl:
    """A subscription per run through the layer's groups (the in-memory layer)."""

    def __init__(self, layer):
        # None: no fast path at all (FastPath(None) would mean "the default layer").
        self.fastpath = FastPath(layer) if layer is not None else None
        self._subscriptions = {}  # run id -> Subscription

    @property
    def available(self):
        return self.fastpath is not None and self.fastpath.available

    async def listen(self, run_id, handler):
        if self.fastpath is None:
            return False
        key = str(run_id)
        subscription = await self.fastpath.subscribe(groups.control(run_id), _Guarded(self, key, handler))
        if subscription is None:
            return False
        self._subscriptions[key] = subscription
        return True

    def forget(self, run_id):
        subscription = self._subscriptions.pop(str(run_id), None)
        if subscription is not None:
            asyncio.ensure_future(subscription.close())

    async def close(self):
        subscriptions, self._subscriptions = list(self._subscriptions.values()), {}
        await asyncio.gather(*(s.close() for s in subscriptions), return_exceptions=True)


class _Guarded:
    """A run's handler that goes quiet the moment the run is forgotten, even if its
    subscription's task has a message in hand."""

    def __init__(self, control, key, handler):
        self.control, self.key, self.handler = control, key, handler

    def __call__(self, message):
        if self.key in self.control._subscriptions:
            return self.handler(message)
        return None
