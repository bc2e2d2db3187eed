"""The escalation's hard stop: a run whose engine does not reach a checkpoint (here a
database call that hangs, the one kind of await the signal does not race) is dropped
at that await when the watchdog's hard stop arrives, and still settles cancelled."""

import asyncio

import pytest
from channels.layers import InMemoryChannelLayer, get_channel_layer

from runs import groups, transitions
from runs.agent.cancel import CancelSignal
from runs.agent.runner import RunState, execute
from tests.runs.agent.conftest import say

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


class HangingCommits:
    """The worker's pool, except that committing a step never returns."""

    def __init__(self, pool):
        self.pool, self.entered, self.never = pool, asyncio.Event(), asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.pool, name)

    async def call(self, fn, /, *args, **kwargs):
        if fn is transitions.commit_step:
            self.entered.set()
            await self.never.wait()
        return await self.pool.call(fn, *args, **kwargs)


async def send_control(run_id, **message):
    """What runs.broadcast sends; the in-memory layer's broadcast from a pool thread has
    no loop to land on, so the test sends it (on Redis the transition's own does)."""
    if isinstance(get_channel_layer(), InMemoryChannelLayer):
        await get_channel_layer().group_send(groups.control(run_id), {"type": "run.cancel", "run_id": str(run_id), **message})


async def test_a_hard_stop_drops_a_run_stuck_past_its_checkpoints_and_it_settles_cancelled(ctx, claimed, fetch, pool):
    ctx.db = hanging = HangingCommits(pool)
    run = await claimed(script=[say(3)])
    state = RunState(run.id, CancelSignal())
    task = asyncio.ensure_future(execute(run, signal=state.signal, ctx=ctx, state=state))
    await asyncio.wait_for(hanging.entered.wait(), 10)  # stuck in a call the signal cannot interrupt
    assert await pool.call(transitions.request_cancel, run.id, by="op") == transitions.CancelOutcome.REQUESTED
    await send_control(run.id)
    assert await pool.call(transitions.escalate_cancel, run.id)  # the watchdog, after the grace
    await send_control(run.id, hard=True)
    await asyncio.wait_for(task, 10)
    row, steps, kinds, by_kind = await fetch(run.id)
    assert (row.status, row.termination_reason, steps) == ("cancelled", "cancelled", [])
    assert state.hard_stopped and not task.cancelled()
    assert kinds.index("cancel_not_honoured") < kinds.index("hard_stopped") < kinds.index("settled")
    assert by_kind["step_discarded"][0]["reason"] == "hard stop"


async def test_a_plain_cancel_never_drops_the_task(ctx, claimed, fetch, pool):
    run = await claimed(script=[say(2000, 5)])
    state = RunState(run.id, CancelSignal())
    task = asyncio.ensure_future(execute(run, signal=state.signal, ctx=ctx, state=state))
    assert await pool.call(transitions.request_cancel, run.id, by="op") == transitions.CancelOutcome.REQUESTED
    await send_control(run.id)
    await asyncio.wait_for(task, 10)
    row, _, kinds, _ = await fetch(run.id)
    assert row.status == "cancelled" and not state.hard_stopped and "hard_stopped" not in kinds
