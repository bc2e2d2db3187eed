"""The tool phase of a step: policy, approval, then the calls.

Checkpoints owned here (numbers as in the table in `runs.agent.loop`):
  6  sequential calls: the signal is polled before each call
  7  parallel calls run in waves of `tool_wave`; the signal is polled at each wave top
  8  each call (or wave) is raced against the signal and abandoned when it fires

Every call returns a record with its result or its error, so a committed step never
holds a call without its result; an abandoned call leaves no record at all.
"""

import asyncio
import json

from runs import messages
from runs.agent.cancel import Cancelled
from runs.agent.outcomes import PolicyDenied
from runs.agent.racing import Racer


def deny_listed(denied):
    """The default policy: refuse tools named in `denied` (settings: RUNWARDEN_DENIED_TOOLS)."""

    def policy(call):
        if call.name in denied:
            return f"tool {call.name!r} is not allowed"
        return None

    return policy


class ToolDispatcher:
    def __init__(self, tools, *, signal, config, context, progress, policy, approve):
        self.tools = tools
        self.signal = signal
        self.config = config
        self.context = context
        self.progress = progress
        self.policy = policy
        self.approve = approve  # async (call) -> None, or raises ApprovalDenied / Cancelled

    async def run(self, reply):
        """Records `[{id, name, args, result | error}]` for every call of `reply`, in order."""
        calls = reply.tool_calls
        for call in calls:
            refusal = self.policy(call)
            if refusal:
                raise PolicyDenied(refusal)
        for call in calls:
            tool = self.tools.get(call.name)
            if reply.needs_approval or (tool is not None and tool.needs_approval):
                await self.approve(call)
        records = []
        async with Racer(self.signal) as racer:
            if reply.parallel:
                size = max(1, self.config.tool_wave)
                for start in range(0, len(calls), size):
                    self.signal.raise_if_cancelled()  # checkpoint 7: the next wave never starts
                    wave = calls[start : start + size]
                    records += await racer.run(asyncio.gather(*(self._one(c) for c in wave)))  # checkpoint 8
            else:
                for call in calls:
                    self.signal.raise_if_cancelled()  # checkpoint 6: the next call never starts
                    records.append(await racer.run(self._one(call)))  # checkpoint 8
        return records

    async def _one(self, call):
        record = {"id": call.id, "name": call.name, "args": call.args}
        tool = self.tools.get(call.name)
        self.progress.tool(call.id, call.name, messages.STARTED)
        try:
            if tool is None:
                raise LookupError(f"unknown tool {call.name!r}")
            result = await asyncio.wait_for(tool.fn(self.context, **call.args), self.config.tool_timeout_s)
            record["result"] = _jsonable(result)
        except Cancelled:
            raise
        except TimeoutError:
            record["error"] = f"tool timed out after {self.config.tool_timeout_s:g}s"
        except Exception as error:  # noqa: BLE001 - a tool's failure is its result
            record["error"] = f"{type(error).__name__}: {error}"
        self.progress.tool(call.id, call.name, messages.FAILED if "error" in record else messages.FINISHED)
        return record


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)
