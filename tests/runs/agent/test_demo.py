"""The demo feeder: varied scripted runs, until told to stop."""

import asyncio
import random

import pytest

from runs import loops
from runs.agent import demo
from runs.agent.providers.scripted import ScriptedProvider
from runs.agent.tools import builtins
from runs.models import Run


def test_demo_shapes_cover_every_ending_and_are_valid_scripts():
    rng = random.Random(7)
    seen = {}
    for n in range(400):
        name, kwargs = demo._shape(rng, n)
        ScriptedProvider(kwargs["input"]["script"])  # well-formed
        seen[name] = kwargs
    assert set(seen) >= {
        "long stream", "tool wave", "budget stop", "provider failure", "approval wait", "worker dies", "policy denial",
        "loop",
    }
    turns = [t for kwargs in seen.values() for t in kwargs["input"]["script"]]
    assert any(t.get("die") for t in turns) and any(t.get("fail") == "provider" for t in turns)
    assert any("ask_approval" in t for t in turns) and any(t.get("parallel") for t in turns)
    names = {c["name"] for t in turns for c in t.get("tools", [])}
    assert names - set(builtins()) == {"shell"}  # the policy denial's tool, and only it
    assert seen["budget stop"]["token_budget"] and seen["tool wave"]["input"]["demo"] == "tool wave"
    calls = [c for t in seen["loop"]["input"]["script"] for c in t.get("tools", [])]
    assert len(calls) == 3 and len({loops.same_call_key(c) for c in calls}) == 1  # flagged repeated_tool


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_feed_keeps_creating_runs_until_stopped(pool):
    stop = asyncio.Event()
    task = asyncio.ensure_future(demo.feed(stop, every_s=0.01, rng=random.Random(1)))
    while await pool.call(Run.objects.count) < 3:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 2)
    runs = await pool.call(lambda: list(Run.objects.all()))
    assert {r.agent for r in runs} == {"scripted"} and all(r.input["demo"] for r in runs)
