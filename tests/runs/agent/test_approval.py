"""Waiting for an operator without holding the run (runs.agent.approval).

The engine releases a run that waits (no worker, no slot, no heartbeat) and keeps the
in-flight reply in the row; any worker resumes it once answered, from its committed
steps, without calling the model again for the step it parked on.
"""

import asyncio
import dataclasses
import json
from decimal import Decimal

import pytest

from runs import transitions, watchdog
from runs.agent import outcomes
from runs.agent.cancel import CancelSignal
from runs.agent.providers.scripted import ScriptedProvider
from runs.agent.runner import execute
from runs.models import Run, RunEvent, Step
from tests.runs.agent.conftest import say

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

GATED = {"ask_approval": {"tool": "echo", "args": {"x": 1}}}


class Recording(ScriptedProvider):
    """The scripted provider, keeping every request's messages by step index."""

    def __init__(self, script, seen):
        super().__init__(script)
        self.seen = seen

    async def stream(self, request):
        self.seen.setdefault(request.index, []).append(json.loads(json.dumps(request.messages)))
        async for item in super().stream(request):
            yield item


def recording(ctx, seen, worker_id):
    return dataclasses.replace(
        ctx, worker_id=worker_id, provider_for=lambda run: Recording(run.input["script"], seen)
    )


async def run_once(ctx, run):
    return await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)


async def resumed_by(ctx, pool, worker_id):
    """What `worker_id` claims next (the answered run first), as it claimed it."""
    return await pool.call(transitions.claim_next, worker=worker_id, agents=["scripted"])


async def test_a_gated_call_releases_the_run_with_its_reply_kept_and_charged(ctx, claimed, fetch):
    run = await claimed(script=[say(2), GATED])
    # Today's engine held the run and polled for the answer: this would time out.
    assert await run_once(ctx, run) is outcomes.PARKED
    row, steps, kinds, by_kind = await fetch(run.id)
    assert (row.status, row.worker, row.heartbeat_at) == ("waiting_for_approval", "", None)
    assert row.is_released and row.wait_deadline is not None
    assert (row.pending_request["tool"], row.pending_request["args"]) == ("echo", {"x": 1})
    parked = row.pending_request["resume"]["step"]
    assert (parked["index"], [c["name"] for c in parked["tool_calls"]]) == (1, ["echo"])
    assert len(steps) == 1 and "step_discarded" not in kinds  # kept, not thrown away
    # The gated reply was paid for whatever the answer: in the totals already.
    assert row.tokens_out == steps[0].tokens_out + parked["tokens_out"]
    assert by_kind["suspended"][-1]["released"] is True
    assert "resume" not in by_kind["suspended"][-1]["request"]  # the timeline shows the ask, not the state


async def test_an_approved_run_is_resumed_by_another_worker_from_its_committed_steps(ctx, claimed, fetch, pool):
    seen = {}
    run = await claimed(script=[say(2), GATED, say(3)])
    await pool.call(transitions.queue_input, run.id, kind="message", payload={"text": "be brief"}, by="op")
    assert await run_once(recording(ctx, seen, "w-test"), run) is outcomes.PARKED
    before, *_ = await fetch(run.id)

    assert await pool.call(transitions.resume, run.id, expect="waiting_for_approval", by="op", answer={"approved": True})
    assert (await fetch(run.id))[0].status == "queued"  # claimable by any worker of its agent
    again = await resumed_by(ctx, pool, "w-other")
    assert again.id == run.id and again.started_at == before.started_at
    outcome = await run_once(recording(ctx, seen, "w-other"), again)

    row, steps, kinds, by_kind = await fetch(run.id)
    assert (outcome.status, row.status, row.termination_reason, row.worker) == ("completed", "completed", "completed", "w-other")
    assert [s.index for s in steps] == [0, 1, 2]  # no duplicate, no gap
    assert steps[1].tool_calls == [{"id": "call_1_0", "name": "echo", "args": {"x": 1}, "result": {"x": 1}}]
    assert len(seen[1]) == 1  # the gated step's model call was made once, by the first worker
    # The second worker asks exactly what one uninterrupted worker would have asked.
    assert seen[2] == [[
        {"role": "user", "content": "t"},
        {"role": "user", "content": "be brief"},
        {"role": "assistant", "content": "w0 w1"},
        {"role": "assistant", "content": "I need approval to run echo.", "tool_calls": [
            {"id": "call_1_0", "type": "function", "function": {"name": "echo", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": '{"x": 1}'},
    ]]
    # Spend counted once: the totals are the steps' sum (the gated one charged at park).
    assert (row.tokens_in, row.tokens_out, row.cost) == (
        sum(s.tokens_in for s in steps), sum(s.tokens_out for s in steps), sum((s.cost for s in steps), Decimal(0))
    )
    assert by_kind["claimed"][-1] == {"status": "running", "resumed": True}
    assert by_kind["resumed"][-1]["requeued"] is True


async def test_a_denied_run_fails_approval_denied_on_the_worker_that_resumes_it(ctx, claimed, fetch, pool):
    run = await claimed(script=[say(2), GATED, say(3)])
    assert await run_once(ctx, run) is outcomes.PARKED
    parked = (await fetch(run.id))[0]
    assert await pool.call(transitions.resume, run.id, expect="waiting_for_approval", by="bob", answer={"approved": False, "note": "not now"})
    # Another worker: its own planes and heartbeat (a copy would share the first one's).
    other = dataclasses.replace(ctx, worker_id="w-other", control=None, deltas=None, beats=None)
    try:
        outcome = await run_once(other, await resumed_by(ctx, pool, "w-other"))
    finally:
        await other.aclose()
    row, steps, kinds, by_kind = await fetch(run.id)
    assert (outcome.reason, row.status, row.termination_reason) == ("approval_denied", "failed", "approval_denied")
    assert "denied by bob: not now" in row.error_message
    assert [s.index for s in steps] == [0]
    discarded = by_kind["step_discarded"][-1]
    assert discarded["index"] == 1 and discarded["tool_calls"] == ["echo"]
    assert (row.tokens_out, row.cost) == (parked.tokens_out, parked.cost)  # charged once, at park


async def test_two_gated_calls_in_one_reply_park_twice_and_keep_the_first_approval(ctx, claimed, fetch, pool):
    script = [{"tools": [{"name": "write_file", "args": {"path": "a.txt", "content": "a"}},
                         {"name": "write_file", "args": {"path": "b.txt", "content": "b"}}]}]
    run = await claimed(script=script)
    gated = dataclasses.replace(ctx, tools=lambda: _gated_tools())
    assert await run_once(gated, run) is outcomes.PARKED
    assert (await fetch(run.id))[0].pending_request["call_id"] == "call_0_0"
    assert await pool.call(transitions.resume, run.id, expect="waiting_for_approval", by="op", answer={"approved": True})
    assert await run_once(gated, await resumed_by(ctx, pool, "w-test")) is outcomes.PARKED
    row, *_ = await fetch(run.id)
    assert row.pending_request["call_id"] == "call_0_1"
    assert row.pending_request["resume"]["step"]["approved"] == ["call_0_0"]
    assert await pool.call(transitions.resume, run.id, expect="waiting_for_approval", by="op", answer={"approved": True})
    assert (await run_once(gated, await resumed_by(ctx, pool, "w-test"))).status == "completed"
    row, steps, *_ = await fetch(run.id)
    assert [c.get("result") is not None for c in steps[0].tool_calls] == [True, True]
    assert row.tool_calls == 2 and row.steps == 1


def _gated_tools():
    from runs.agent.tools import builtins

    tools = builtins()
    tools["write_file"] = dataclasses.replace(tools["write_file"], needs_approval=True)
    return tools


async def test_an_unanswered_wait_is_ended_by_the_watchdog(ctx, claimed, fetch, pool):
    run = await claimed(script=[say(2), GATED])
    run.input["approval_timeout_s"] = 0.05
    assert await run_once(ctx, run) is outcomes.PARKED
    parked = (await fetch(run.id))[0]
    first = await pool.call(lambda: watchdog.sweep(reap_s=0.01))
    assert first.reaped == []  # released: never reaped (it may have expired already)
    expired, deadline = first.expired, asyncio.get_running_loop().time() + 10
    while not expired:  # until the database clock passes the deadline
        assert asyncio.get_running_loop().time() < deadline, "the wait never expired"
        await asyncio.sleep(0.02)
        expired = await pool.call(lambda: watchdog.sweep().expired)
    assert expired == [run.id]
    row, steps, kinds, by_kind = await fetch(run.id)
    assert (row.status, row.termination_reason, row.error_class) == ("failed", "approval_denied", "ApprovalTimeout")
    assert "deadline" in row.error_message and not row.is_retryable
    assert by_kind["settled"][-1]["expired"] == "waiting_for_approval"
    assert by_kind["step_discarded"][-1]["index"] == 1 and len(steps) == 1
    assert (row.tokens_out, row.cost) == (parked.tokens_out, parked.cost)
    # The answer arrives too late: refused, nothing changes.
    assert not await pool.call(transitions.resume, run.id, expect="waiting_for_approval", by="op", answer={"approved": True})


async def test_waiting_for_input_releases_the_run_and_resumes_with_the_operators_text(ctx, claimed, fetch, pool):
    seen = {}
    run = await claimed(script=[say(2), {"ask_input": {"prompt": "Which region?"}}, say(3)])
    assert await run_once(recording(ctx, seen, "w-test"), run) is outcomes.PARKED
    row, steps, *_ = await fetch(run.id)
    assert (row.status, row.worker, row.pending_request["prompt"]) == ("waiting_for_input", "", "Which region?")
    assert [s.text for s in steps] == ["w0 w1", "Which region?"]  # the question is a committed step
    assert await pool.call(transitions.resume, run.id, expect="waiting_for_input", by="op", answer={"text": "eu-west"})
    outcome = await run_once(recording(ctx, seen, "w-other"), await resumed_by(ctx, pool, "w-other"))
    row, steps, *_ = await fetch(run.id)
    assert (outcome.status, row.status, [s.index for s in steps]) == ("completed", "completed", [0, 1, 2])
    assert seen[2][0][-2:] == [{"role": "assistant", "content": "Which region?"}, {"role": "user", "content": "eu-west"}]


async def test_an_unanswered_input_ends_approval_denied_with_its_own_error_class(ctx, claimed, fetch, pool):
    run = await claimed(script=[{"ask_input": {"prompt": "?"}}, say(1)])
    run.input["approval_timeout_s"] = 0.05
    assert await run_once(ctx, run) is outcomes.PARKED
    deadline = asyncio.get_running_loop().time() + 10
    while not await pool.call(lambda: transitions.expire_waits()):
        assert asyncio.get_running_loop().time() < deadline, "the wait never expired"
        await asyncio.sleep(0.02)
    row, steps, kinds, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, row.error_class) == ("failed", "approval_denied", "InputTimeout")
    assert len(steps) == 1 and "step_discarded" not in kinds  # nothing was in flight


async def test_a_bad_wait_timeout_fails_the_run_with_a_clear_message(ctx, claimed, fetch):
    run = await claimed(script=[GATED])
    run.input["approval_timeout_s"] = "soon"
    outcome = await run_once(ctx, run)
    assert outcome.status == "failed" and "approval_timeout_s must be a positive number" in outcome.error_message
