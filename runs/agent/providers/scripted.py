"""The scripted provider: deterministic replies for demos and tests (agent `scripted`).

`run.input["script"]` is a list of turns, one per step:

    {"say": TEXT, "token_delay_ms": N}             stream TEXT word by word, N ms apart
    {"tools": [{"name": ..., "args": {...}}], "parallel": BOOL, "say": TEXT?}
                                                   call tools (in parallel waves if BOOL)
    {"fail": "provider"}                           raise a provider error (every attempt)
    {"fail": "stream", "say": TEXT}                the stream breaks; the fallback answers
    {"ask_approval": {"tool": ..., "args": {...}}} call a tool that needs an approval
    {"ask_input": {"prompt": TEXT}}                ask the operator; wait for their input
    {"die": true}                                  the worker "dies": stops heartbeating

The run completes when the script ends. Usage is counted one token per word.
"""

import asyncio
from decimal import Decimal

from runs.agent.providers.base import (
    Provider,
    ProviderError,
    Reply,
    SimulatedDeath,
    ToolCall,
)

PRICE_PER_TOKEN = Decimal("0.000002")


class ScriptError(ValueError):
    """The script is malformed."""


class ScriptedProvider(Provider):
    name = "scripted"

    def __init__(self, script):
        if not isinstance(script, list) or not all(isinstance(t, dict) for t in script):
            raise ScriptError('input["script"] must be a list of turn objects')
        self.script = script
        self.calls = 0  # requests made: tests assert the provider was (not) touched

    def exhausted(self, index):
        return index >= len(self.script)

    def _turn(self, index):
        turn = self.script[index]
        if turn.get("die"):
            raise SimulatedDeath(f"scripted death at turn {index}")
        if turn.get("fail") == "provider":
            raise ProviderError("scripted provider failure", error_class="ScriptedProviderError")
        return turn

    async def stream(self, request):
        self.calls += 1
        turn = self._turn(request.index)
        words = (turn.get("say") or "").split()
        delay = max(0, int(turn.get("token_delay_ms", 0))) / 1000
        for i, word in enumerate(words):
            if i and delay:
                await asyncio.sleep(delay)
            if turn.get("fail") == "stream" and i >= len(words) // 2:
                raise ProviderError("scripted stream broke", error_class="ScriptedStreamError")
            yield word if i == 0 else " " + word
        yield self._reply(request, turn)

    async def complete(self, request):
        self.calls += 1
        return self._reply(request, self._turn(request.index))

    def estimate(self, request, streamed):
        """Exactly what the reply would have counted for the words streamed so far."""
        tokens_in, tokens_out = 8 + 4 * len(request.messages), len(streamed.split())
        return tokens_in, tokens_out, PRICE_PER_TOKEN * (tokens_in + tokens_out)

    def _reply(self, request, turn):
        text = " ".join((turn.get("say") or "").split())
        calls, approval = [], False
        if "tools" in turn:
            calls = [_call(request.index, i, spec) for i, spec in enumerate(turn["tools"])]
        elif "ask_approval" in turn:
            spec = turn["ask_approval"]
            calls, approval = [_call(request.index, 0, {"name": spec.get("tool"), "args": spec.get("args")})], True
            text = text or f"I need approval to run {spec.get('tool')}."
        asks = "ask_input" in turn
        if asks:
            text = text or str((turn["ask_input"] or {}).get("prompt") or "What should I do next?")
        tokens_in = 8 + 4 * len(request.messages)
        tokens_out = len(text.split()) + 4 * len(calls)
        return Reply(
            text=text,
            tool_calls=calls,
            parallel=bool(turn.get("parallel")),
            needs_approval=approval,
            needs_input=asks,
            final=False,  # the script's end, not the reply, ends the run
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=PRICE_PER_TOKEN * (tokens_in + tokens_out),
        )


def _call(index, i, spec):
    if not isinstance(spec, dict) or not spec.get("name"):
        raise ScriptError(f"turn {index}: a tool call needs a name")
    return ToolCall(id=f"call_{index}_{i}", name=str(spec["name"]), args=dict(spec.get("args") or {}))
