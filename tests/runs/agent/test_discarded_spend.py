"""A discarded step was paid for: its tokens and cost count in the run's totals and
are shown apart on its `step_discarded` entry (issue: aborted runs showed no spend)."""

import asyncio
from decimal import Decimal

import pytest
from channels.layers import get_channel_layer

from runs import groups
from runs.agent.cancel import CancelSignal
from runs.agent.runner import execute

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

LONG = " ".join(f"w{i}" for i in range(60))


async def test_a_cancel_mid_stream_counts_the_discarded_steps_spend(ctx, claimed, fetch):
    layer = get_channel_layer()
    signal = CancelSignal()
    run = await claimed(script=[{"say": "one two three"}, {"say": LONG, "token_delay_ms": 10}])
    viewer = await layer.new_channel()
    await layer.group_add(groups.viewers(run.id), viewer)
    task = asyncio.ensure_future(execute(run, signal=signal, ctx=ctx))
    streamed = ""
    while len(streamed.split()) < 5:  # some of step 1 has streamed (and been paid for)
        message = await asyncio.wait_for(layer.receive(viewer), 10)
        if message.get("type") == "run.progress" and message["step"] == 1:
            streamed = streamed[: message["offset"]] + message["text"]
    signal.cancel()
    await asyncio.wait_for(task, 10)
    row, steps, _, by_kind = await fetch(run.id)
    (discarded,) = by_kind["step_discarded"]
    assert (row.status, len(steps)) == ("cancelled", 1)
    words = len(discarded["text"].split())
    assert words >= 5 and discarded["estimated"] is True
    assert discarded["tokens_out"] == words  # the scripted provider counts a token a word
    assert discarded["tokens_in"] > 0 and Decimal(discarded["cost"]) > 0
    assert row.tokens_out == steps[0].tokens_out + discarded["tokens_out"]
    assert row.tokens_in == steps[0].tokens_in + discarded["tokens_in"]
    assert row.cost == steps[0].cost + Decimal(discarded["cost"])


async def test_a_cancel_before_anything_streamed_charges_nothing(ctx, claimed, fetch):
    signal = CancelSignal()
    signal.cancel()
    run = await claimed(script=[{"say": LONG}])
    await asyncio.wait_for(execute(run, signal=signal, ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, steps, row.tokens_in, row.tokens_out, row.cost) == ("cancelled", [], 0, 0, 0)
