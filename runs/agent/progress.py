"""Deltas of the in-flight step, to the run's viewers group, coalesced at the source.

Messages are `runs.messages.progress` (the contract with the dashboard), tool states
`runs.messages.TOOL_STATES` (started, finished, failed: the agent API's words). The run only records what it streamed and tells the worker's DeltaPublisher it has
something; the publisher takes ONE message per run per batch (`take()`), holding all
the text since the last one, so a run sends at most `hz` messages a second and a lagging
layer makes messages longer, not more numerous. Chunks are contiguous: a viewer that
sees an offset past what it holds knows it missed one and asks for a resync (answered
by `snapshot()`: offset 0, the whole text so far, `"resync": true`). Committed steps go
to the database, never through here.
"""

from runs import messages
from runs.agent.deltas import DeltaPublisher


class Progress:
    def __init__(self, run_id, publisher, *, step=0):
        self.run_id = str(run_id)
        self.publisher = publisher if publisher is not None else DeltaPublisher(None)
        self.step = step  # the in-flight step, or the next one between steps
        self.text = ""
        self._sent = 0  # chars of `text` already handed to the publisher
        self._tools = {}
        self._tools_dirty = False
        self._resync = False  # the next message starts the step over (offset 0)
        self._held = []  # messages built by flush(), not yet taken
        self.messages = 0  # handed to the publisher; tests read it
        self.publisher.attach(self)

    def start(self, index):
        """A new in-flight step begins."""
        self.step, self.text, self._sent, self._tools, self._tools_dirty = index, "", 0, {}, False
        self._resync = False

    def append(self, chunk):
        self.text += chunk
        self.publisher.pending(self)

    def committed(self, index):
        """Step `index` is in the database now: nothing is in flight until the next."""
        self.start(index + 1)

    def restart(self):
        """The streamed text is void (a fallback answers anew): viewers start over."""
        self.text, self._sent, self._resync = "", 0, True
        self.publisher.pending(self)

    def tool(self, call_id, name, state):
        self._tools[call_id] = messages.tool(call_id, name, state)
        self._tools_dirty = True
        self.publisher.pending(self)

    def flush(self):
        """Seal what is pending now (before a commit, so viewers get the whole text of
        the step even though the next step starts before the publisher comes round)."""
        message = self._build()
        if message is not None:
            # A sealed message of an older step is superseded: that step is committed
            # (or discarded) by now, and viewers render it from the database.
            self._held = [m for m in self._held if m["step"] == message["step"]] + [message]
            self.publisher.pending(self)

    def take(self):
        """The publisher's side: every message due now (sealed ones first), at most one
        for the step in flight, holding all its text since the last one."""
        messages, self._held = self._held, []
        message = self._build()
        if message is not None:
            messages.append(message)
        self.messages += len(messages)
        return messages

    def snapshot(self):
        """The whole in-flight step so far, for a reconnecting viewer."""
        return messages.progress(
            self.run_id, self.step, text=self.text, tools=list(self._tools.values()) or None, resync=True
        )

    async def close(self):
        """The run is over. What is sealed still goes out with the next batch (the last
        step's tail), so a viewer's text matches the committed step."""
        self.publisher.detach(self)

    def _build(self):
        if not (self._resync or self._tools_dirty or self._sent < len(self.text)):
            return None
        offset = 0 if self._resync else self._sent
        message = messages.progress(
            self.run_id, self.step, offset=offset, text=self.text[offset:],
            tools=list(self._tools.values()) if self._tools_dirty else None, resync=self._resync,
        )
        self._sent, self._tools_dirty, self._resync = len(self.text), False, False
        return message
