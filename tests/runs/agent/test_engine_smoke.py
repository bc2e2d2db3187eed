import asyncio

import pytest

from runs.agent.cancel import CancelSignal
from runs.agent.runner import execute
from tests.runs.agent.conftest import say

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_scripted_run_completes_with_its_steps(ctx, claimed, fetch):
    run = await claimed(script=[say(5), {"tools": [{"name": "echo", "args": {"x": 1}}]}, say(3)])
    outcome = await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, kinds, _ = await fetch(run.id)
    assert (row.status, row.termination_reason) == ("completed", "completed")
    assert [s.kind for s in steps] == ["message", "tool_calls", "message"]
    assert steps[1].tool_calls[0]["result"] == {"x": 1}
    assert outcome.status == "completed"
