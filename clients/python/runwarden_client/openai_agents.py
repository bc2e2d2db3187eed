"""The OpenAI Agents SDK (`openai-agents`) into Runwarden, with two added lines:

    async with client.run("support-bot") as run:                 # + 1: a Runwarden run
        result = Runner.run_streamed(agent, "Where is my parcel?")
        async for event in watched(run, result):                   # + 1: was result.stream_events()
            ...

`watched` yields the SDK's events unchanged while it streams the text deltas to the
dashboard, shows each tool call starting and finishing, commits a step at the end of
each model turn (its text, its tool calls with their outputs, the turn's token usage)
and checks the run's cancel at every event. An operator's Abort interrupts the task at
its next await (the `AsyncRun` cancels it): `watched` then cancels the SDK's own run
(`result.cancel()`, so no further model call or tool starts), and the run settles
cancelled with the half turn discarded. A guardrail's stop (a budget the run crossed)
stops it the same way and settles completed/budget_exhausted, truncated (or failed/
policy_denied for a loop policy). `run_streamed(run, agent, input)` does both
lines' work in one call, for agents that do not look at the events.
"""

import json

from agents import Runner

from runwarden_client.aio import AsyncRun

__all__ = ["run_streamed", "watched"]


async def watched(run: AsyncRun, result):
    """Yield `result.stream_events()` while reporting them into `run` (see the module)."""
    calls = {}  # call_id -> (name, args): an output names only its call
    turn_open = False
    try:
        async for event in result.stream_events():
            run.checkpoint()
            if event.type == "raw_response_event":
                kind = getattr(event.data, "type", "")
                if kind == "response.created":
                    if turn_open:
                        await _commit(run)
                    turn_open = True
                elif kind == "response.output_text.delta":
                    run.stream(event.data.delta)
                elif kind == "response.completed":
                    usage = getattr(event.data.response, "usage", None)
                    if usage is not None:
                        run.usage(tokens_in=usage.input_tokens or 0, tokens_out=usage.output_tokens or 0)
            elif event.type == "run_item_stream_event":
                if event.name == "tool_called":
                    raw = event.item.raw_item
                    call_id, name = _field(raw, "call_id") or _field(raw, "id"), _field(raw, "name") or "tool"
                    args = _arguments(_field(raw, "arguments"))
                    calls[call_id] = (name, args)
                    run.tool_started(name, args, call_id=call_id)
                elif event.name == "tool_output":
                    call_id = _field(event.item.raw_item, "call_id")
                    name, args = calls.pop(call_id, ("tool", None))
                    run.tool_finished(call_id, name, args, result=_jsonable(event.item.output))
            yield event
        if turn_open:
            await _commit(run)
    except BaseException:
        result.cancel()  # a cancel, an error or the caller leaving: the SDK's task stops too
        raise


async def run_streamed(run: AsyncRun, agent, input, **kwargs):
    """`Runner.run_streamed(agent, input, **kwargs)` reported into `run`; the finished result."""
    result = Runner.run_streamed(agent, input, **kwargs)
    async for _ in watched(run, result):
        pass
    return result


async def _commit(run):
    if run.state.in_flight() or run.state.tool_calls:
        await run.step()


def _field(raw, name):
    return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)


def _arguments(text):
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {"arguments": text}


def _jsonable(value):
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
