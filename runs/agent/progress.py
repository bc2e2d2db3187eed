"""Deltas of the in-flight step, to the run's viewers group, coalesced.

Message (contract with the dashboard):
    {"type": "run.progress", "run_id": str, "step": <in-flight step index>,
     "offset": <char offset in that step's streamed text where `text` starts>,
     "text": <chunk>, "tools": [{"id", "name", "state": running|done|error}]?}
At most `hz` messages per second per run; chunks are contiguous, so a viewer that sees
an offset past what it holds knows it missed one and asks for a resync (answered by
`snapshot()`: offset 0, the whole text so far, `"resync": true`). Committed steps go
to the database, never through here.
"""

import asyncio
import time

from runs import groups


class Progress:
    def __init__(self, run_id, fastpath, *, hz=10.0, step=0):
        self.run_id = str(run_id)
        self.fastpath = fastpath
        self.interval = 1.0 / hz if hz > 0 else 0.0
        self.step = step  # the in-flight step, or the next one between steps
        self.text = ""
        self._sent = 0  # chars of `text` already sent
        self._tools = {}
        self._tools_dirty = False
        self._last = 0.0
        self._timer = None
        self._outbox = asyncio.Queue()
        self._sender = None
        self.messages = 0  # sent or queued; tests read it

    def start(self, index):
        """A new in-flight step begins."""
        self._cancel_timer()
        self.step, self.text, self._sent, self._tools, self._tools_dirty = index, "", 0, {}, False

    def append(self, chunk):
        self.text += chunk
        self._schedule()

    def committed(self, index):
        """Step `index` is in the database now: nothing is in flight until the next."""
        self.start(index + 1)

    def restart(self):
        """The streamed text is void (a fallback answers anew): viewers start over."""
        self.text, self._sent = "", 0
        self._cancel_timer()
        self._queue({**self._base(), "offset": 0, "text": "", "resync": True})

    def tool(self, call_id, name, state):
        self._tools[call_id] = {"id": call_id, "name": name, "state": state}
        self._tools_dirty = True
        self._schedule()

    def flush(self):
        """Send what is pending now (before a commit, so viewers hold the whole text)."""
        self._cancel_timer()
        if self._sent < len(self.text) or self._tools_dirty:
            self._emit()

    def snapshot(self):
        """The whole in-flight step so far, for a reconnecting viewer."""
        message = {**self._base(), "offset": 0, "text": self.text, "resync": True}
        if self._tools:
            message["tools"] = list(self._tools.values())
        return message

    async def close(self):
        self._cancel_timer()
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)

    def _base(self):
        return {"type": "run.progress", "run_id": self.run_id, "step": self.step}

    def _schedule(self):
        if self._timer is not None:
            return
        delay = self._last + self.interval - time.monotonic()
        if delay <= 0:
            self._emit()
        else:
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self):
        self._timer = None
        self._emit()

    def _emit(self):
        message = {**self._base(), "offset": self._sent, "text": self.text[self._sent :]}
        if self._tools_dirty:
            message["tools"] = list(self._tools.values())
            self._tools_dirty = False
        self._sent = len(self.text)
        self._last = time.monotonic()
        self._queue(message)

    def _queue(self, message):
        self.messages += 1
        self._outbox.put_nowait(message)
        if self._sender is None:
            self._sender = asyncio.ensure_future(self._send_loop())

    async def _send_loop(self):
        # One sender per run keeps the chunks in offset order.
        group = groups.viewers(self.run_id)
        while True:
            message = await self._outbox.get()
            await self.fastpath.group_send(group, message)

    def _cancel_timer(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
