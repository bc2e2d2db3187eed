"""A best-effort wrapper of the channel layer (the worker's own subscriptions; the
control and data planes each hold one of their own, so one's failures are its own).

The database is the truth and the heartbeat's answer is the slow path, so nothing
here may block the engine or raise into it: every layer operation has a timeout, and
after a failure the layer is considered down for a cooldown (no call waits on a dead
Redis), then tried again.
"""

import asyncio
import inspect
import logging
import time

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


class FastPath:
    def __init__(self, layer=None, *, timeout_s=0.5, cooldown_s=5.0):
        self.layer = layer if layer is not None else get_channel_layer()
        self.timeout_s = timeout_s
        self.cooldown_s = cooldown_s
        self._down_until = 0.0

    @classmethod
    def off(cls):
        """No channel layer at all: every cancel takes the heartbeat (tests, outages)."""
        fastpath = cls(layer=object())
        fastpath.layer = None
        return fastpath

    @property
    def available(self):
        return self.layer is not None and time.monotonic() >= self._down_until

    async def _op(self, make):
        """Run `make()` (a coroutine factory) with a timeout: its result (True for
        None), or None on any failure."""
        if not self.available:
            return None
        try:
            result = await asyncio.wait_for(make(), self.timeout_s)
            return True if result is None else result
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the fast path is optional by design
            if self.available:
                log.warning("fast path unavailable (%s: %s); relying on heartbeats", type(error).__name__, error)
            self._down_until = time.monotonic() + self.cooldown_s
            return None

    async def group_send(self, group, message):
        return await self._op(lambda: self.layer.group_send(group, message)) is not None

    async def send(self, channel, message):
        return await self._op(lambda: self.layer.send(channel, message)) is not None

    async def subscribe(self, group, handler):
        """Listen on `group`; `handler(message)` (sync or async) gets each message.
        Returns a Subscription, or None when the layer is unavailable."""
        channel = await self._op(self.layer.new_channel) if self.layer is not None else None
        if channel is None:
            return None
        if await self._op(lambda: self.layer.group_add(group, channel)) is None:
            return None
        return Subscription(self, group, channel, handler)


class Subscription:
    def __init__(self, fastpath, group, channel, handler):
        self.fastpath = fastpath
        self.group = group
        self.channel = channel
        self.handler = handler
        self._task = asyncio.ensure_future(self._listen())

    async def _listen(self):
        layer = self.fastpath.layer
        while True:
            try:
                message = await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - stop listening; heartbeats carry on
                log.warning("fast path receive failed on %s: %s", self.group, error)
                return
            try:
                result = self.handler(message)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - one bad message must not end the listener
                log.exception("fast path handler failed for %s", self.group)

    async def close(self):
        await self.fastpath._op(lambda: self.fastpath.layer.group_discard(self.group, self.channel))
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
