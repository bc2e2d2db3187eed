"""One test per checkpoint of the table in runs.agent.loop: the cancel lands there,
the in-flight step is discarded (no Step row, text kept on `step_discarded`), and
steps committed before stay. Each cancel is fired at an exact point, not after a sleep."""

import asyncio
import dataclasses
import time

import pytest

from runs import transitions
from runs.agent.cancel import CancelSignal
from runs.agent.loop import Stats
from runs.agent.runner import execute
from tests.runs.agent.probes import Probe, Recorder, calls, fail, hang

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

TEXT = ["one ", "two ", "three ", "four ", "five"]


async def go(ctx, run, provider, *, signal=None, tools=None):
    signal = signal or CancelSignal()
    ctx.provider_for = lambda _run: provider
    if tools is not None:
        ctx.tools = tools.registry
    started = time.monotonic()
    outcome = await asyncio.wait_for(execute(run, signal=signal, ctx=ctx), 10)
    return outcome, time.monotonic() - started


def assert_discarded(row, steps, by_kind, *, index, committed, text=None):
    assert (row.status, row.termination_reason) == ("cancelled", "cancelled")
    assert [s.index for s in steps] == list(range(committed))
    assert row.steps == committed
    discarded = by_kind.get("step_discarded", [])
    assert [d["index"] for d in discarded] == [index]
    assert discarded[0]["interrupted"] is True
    if text is not None:
        assert discarded[0]["text"] == text


class FiringStats(Stats):
    """Fires the signal the moment a given counter moves (a cancel at that instant)."""

    def __init__(self, counter, fire):
        super().__init__()
        object.__setattr__(self, "_watch", (counter, fire))

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        watch = getattr(self, "_watch", None)
        if watch and name == watch[0] and value:
            watch[1]()


async def test_cancel_at_turn_entry_never_touches_the_provider(ctx, claimed, fetch):
    signal = CancelSignal()
    probe = Probe([(TEXT, {}), (TEXT, {})])
    real = ctx.db

    class FireAfterCommit:
        async def call(self, fn, *args, **kwargs):
            result = await real.call(fn, *args, **kwargs)
            if fn is transitions.commit_step and result is not None:
                signal.cancel()  # between step 0's commit and step 1's turn entry
            return result

        urgent = real.urgent

    ctx.db = FireAfterCommit()
    run = await claimed()
    outcome, _ = await go(ctx, run, probe, signal=signal)
    ctx.db = real
    row, steps, kinds, by_kind = await fetch(run.id)
    assert outcome.status == "cancelled"
    assert probe.stream_calls == 1  # turn 1 never reached the provider
    assert [s.index for s in steps] == [0]  # the step committed before stays
    assert "step_discarded" not in kinds  # nothing was in flight


async def test_cancel_during_a_non_streaming_call_abandons_the_request(ctx, claimed, fetch):
    async def fire_then_hang(probe, index):
        asyncio.get_running_loop().call_soon(signal.cancel)
        await hang()

    signal = CancelSignal()
    probe = Probe([(TEXT, {})], streaming=False, on_complete=fire_then_hang)
    run = await claimed()
    outcome, elapsed = await go(ctx, run, probe, signal=signal)
    row, steps, _, by_kind = await fetch(run.id)
    assert probe.abandoned  # and within go()'s 10 s: a hung probe never returns
    assert_discarded(row, steps, by_kind, index=0, committed=0, text="")


async def test_cancel_during_the_stream_discards_the_step_keeping_its_text(ctx, claimed, fetch):
    async def fire_mid_stream(probe, index, i):
        if i == 3:
            asyncio.get_running_loop().call_soon(signal.cancel)
            await hang()

    signal = CancelSignal()
    probe = Probe([(TEXT, {})], on_stream=fire_mid_stream)
    run = await claimed()
    outcome, elapsed = await go(ctx, run, probe, signal=signal)
    row, steps, _, by_kind = await fetch(run.id)
    assert probe.abandoned  # and within go()'s 10 s: a hung probe never returns
    assert_discarded(row, steps, by_kind, index=0, committed=0, text="one two three ")


async def test_cancel_during_the_rate_gate_sleep_never_opens_the_stream(ctx, claimed, fetch):
    signal = CancelSignal()
    probe = Probe([(TEXT, {})], gate_s=30, on_gate=lambda p: asyncio.get_running_loop().call_soon(signal.cancel))
    run = await claimed()
    outcome, elapsed = await go(ctx, run, probe, signal=signal)  # go() gives up at 10 s: the gate is 30 s
    row, steps, _, by_kind = await fetch(run.id)
    assert probe.gates == 1 and probe.stream_calls == 0
    assert_discarded(row, steps, by_kind, index=0, committed=0)


async def test_cancel_as_the_stream_fails_never_sends_the_fallback(ctx, claimed, fetch):
    async def break_stream(probe, index, i):
        if i == 2:
            fail("stream broke")

    signal = CancelSignal()
    ctx.stats = FiringStats("stream_failures", signal.cancel)
    probe = Probe([(TEXT, {})], on_stream=break_stream)
    run = await claimed()
    outcome, _ = await go(ctx, run, probe, signal=signal)
    row, steps, _, by_kind = await fetch(run.id)
    assert probe.stream_calls == 1 and probe.complete_calls == 0  # the rescue was never sent
    assert ctx.breakers.get("probe").failures == 0
    assert_discarded(row, steps, by_kind, index=0, committed=0, text="one two ")


async def test_cancel_between_sequential_tool_calls_never_starts_the_next(ctx, claimed, fetch):
    signal = CancelSignal()
    tools = Recorder(signal, fire={"a"})
    probe = Probe([(TEXT, calls("a", "b", "c"))])
    run = await claimed()
    outcome, _ = await go(ctx, run, probe, signal=signal, tools=tools)
    row, steps, _, by_kind = await fetch(run.id)
    assert tools.started == ["a"]
    assert_discarded(row, steps, by_kind, index=0, committed=0, text="one two three four five")
    assert by_kind["step_discarded"][0]["tool_calls"] == ["a", "b", "c"]


async def test_cancel_in_a_parallel_wave_never_starts_the_next_wave(ctx, claimed, fetch):
    signal = CancelSignal()
    ctx.config = dataclasses.replace(ctx.config, tool_wave=2)
    tools = Recorder(signal, fire={"a"})
    probe = Probe([(TEXT, calls("a", "b", "c", "d", parallel=True))])
    run = await claimed()
    outcome, _ = await go(ctx, run, probe, signal=signal, tools=tools)
    row, steps, _, by_kind = await fetch(run.id)
    assert set(tools.started) <= {"a", "b"} and "a" in tools.started
    assert "c" not in tools.started and "d" not in tools.started
    assert_discarded(row, steps, by_kind, index=0, committed=0)


async def test_cancel_during_a_tool_call_abandons_the_tool(ctx, claimed, fetch):
    signal = CancelSignal()
    tools = Recorder(signal, block={"b"})
    probe = Probe([(TEXT, {}), (["go"], calls("a", "b", "c"))])
    run = await claimed()
    outcome, elapsed = await go(ctx, run, probe, signal=signal, tools=tools)
    row, steps, _, by_kind = await fetch(run.id)
    assert tools.started == ["a", "b"] and tools.abandoned == ["b"] and "b" not in tools.finished
    assert_discarded(row, steps, by_kind, index=1, committed=1, text="go")
    assert steps[0].kind == "message"


async def test_cancel_during_retry_backoff_starts_no_retry(ctx, claimed, fetch):
    async def always_fail(probe, index, i):
        fail("provider down")

    signal = CancelSignal()
    ctx.config = dataclasses.replace(ctx.config, backoff_base_s=30, backoff_max_s=30)
    # The moment the first failure is counted, the 30 s backoff is about to start.
    ctx.stats = FiringStats("provider_failures", lambda: asyncio.get_running_loop().call_soon(signal.cancel))
    probe = Probe([(TEXT, {})], on_stream=always_fail, on_complete=lambda p, i: always_fail(p, i, 0))
    run = await claimed()
    outcome, elapsed = await go(ctx, run, probe, signal=signal)
    row, steps, _, by_kind = await fetch(run.id)  # go() gives up at 10 s: the backoff is 30 s
    # One attempt: its stream and its fallback; no retry started.
    assert probe.stream_calls == 1 and probe.complete_calls == 1
    assert_discarded(row, steps, by_kind, index=0, committed=0)


async def test_cancel_before_dispatch_settles_without_building_a_provider(ctx, claimed, fetch):
    signal = CancelSignal()
    signal.cancel()
    built = []
    ctx.provider_for = lambda run: built.append(run) or Probe([(TEXT, {})])
    run = await claimed()
    outcome = await asyncio.wait_for(execute(run, signal=signal, ctx=ctx), 10)
    row, steps, kinds, _ = await fetch(run.id)
    assert outcome.status == "cancelled" and built == []
    assert (row.status, row.termination_reason, row.steps) == ("cancelled", "cancelled", 0)
    assert "step_discarded" not in kinds
    assert not signal.is_cancelled()  # re-armed after the run


async def test_every_row_of_the_checkpoint_table_names_a_test_that_exists():
    import re

    from runs.agent import loop

    rows = re.findall(r"^\s+(\d+)\s+(test_\w+)$", loop.__doc__, re.M)
    assert [int(n) for n, _ in rows] == list(range(1, 11))
    for _, name in rows:
        assert callable(globals().get(name)), name
