"""Test providers and tools that fire the cancel at one exact point, with no timing."""

import asyncio

from runs.agent.providers.base import Provider, ProviderError, Reply, ToolCall
from runs.agent.tools import Tool, builtins


class Probe(Provider):
    """A provider driven by callbacks. `turns` is a list of (chunks, reply_kwargs);
    `on_stream(probe, index, i)` runs before yielding chunk i (may fire, raise, block)."""

    name = "probe"

    def __init__(self, turns, *, streaming=True, gate_s=0.0, on_stream=None, on_complete=None, on_gate=None):
        self.turns = turns
        self.streaming = streaming
        self.gate_s = gate_s
        self.on_stream = on_stream
        self.on_complete = on_complete
        self.on_gate = on_gate
        self.stream_calls = self.complete_calls = self.gates = 0
        self.abandoned = False  # set when a request or stream was dropped mid-flight
        self.closed = False

    def exhausted(self, index):
        return index >= len(self.turns)

    def gate(self):
        self.gates += 1
        if self.on_gate:
            self.on_gate(self)
        return self.gate_s

    async def stream(self, request):
        self.stream_calls += 1
        chunks, reply = self.turns[request.index]
        try:
            for i, chunk in enumerate(chunks):
                if self.on_stream:
                    await self.on_stream(self, request.index, i)
                yield chunk
            yield Reply(text="".join(chunks), final=False, tokens_out=len(chunks), **reply)
        except (asyncio.CancelledError, GeneratorExit):
            self.abandoned = True
            raise

    async def complete(self, request):
        self.complete_calls += 1
        try:
            if self.on_complete:
                await self.on_complete(self, request.index)
        except asyncio.CancelledError:
            self.abandoned = True
            raise
        chunks, reply = self.turns[request.index]
        return Reply(text="".join(chunks), final=False, tokens_out=len(chunks), **reply)

    async def aclose(self):
        self.closed = True


def calls(*names, parallel=False):
    return {"tool_calls": [ToolCall(id=f"c{i}", name=n, args={}) for i, n in enumerate(names)], "parallel": parallel}


class Recorder:
    """Tools `a`, `b`, `c`, `d` that record starts and finishes; `block` ones hang until
    abandoned; `fire` ones fire the signal when their work is done."""

    def __init__(self, signal, *, fire=(), block=()):
        self.signal = signal
        self.fire = set(fire)
        self.block = set(block)
        self.started, self.finished, self.abandoned = [], [], []

    def registry(self):
        tools = builtins()
        for name in "abcd":
            tools[name] = Tool(name, self._make(name))
        return tools

    def _make(self, name):
        async def tool(ctx, **args):
            self.started.append(name)
            try:
                if name in self.block:
                    asyncio.get_running_loop().call_soon(self.signal.cancel)
                    await asyncio.Event().wait()
                if name in self.fire:
                    self.signal.cancel()
                self.finished.append(name)
                return name
            except asyncio.CancelledError:
                self.abandoned.append(name)
                raise

        return tool


async def hang(*_):
    await asyncio.Event().wait()


def fail(message="boom", retryable=True):
    raise ProviderError(message, retryable=retryable, error_class="ProbeError")
