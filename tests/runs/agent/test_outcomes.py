"""How runs end: each ending's status and reason, and the rules around a cancel."""

import asyncio
import dataclasses

import pytest

from runs import transitions
from runs.agent import outcomes
from runs.agent.cancel import CancelSignal
from runs.agent.runner import execute
from runs.models import Run, RunInput
from tests.runs.agent.conftest import say
from tests.runs.agent.probes import Probe, fail, hang

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

TEXT = ["one ", "two ", "three "]


async def test_one_cancel_gives_exactly_one_cancelled_run(ctx, claimed, fetch):
    slot = CancelSignal()
    slot.cancel()  # fired before any run starts on this slot
    first, second = await claimed(script=[say(3)]), await claimed(script=[say(3)])
    assert (await asyncio.wait_for(execute(first, signal=slot, ctx=ctx), 10)).status == "cancelled"
    assert (await asyncio.wait_for(execute(second, signal=slot, ctx=ctx), 10)).status == "completed"
    assert (await fetch(first.id))[0].status == "cancelled"
    row, steps, _, _ = await fetch(second.id)
    assert (row.status, row.termination_reason, len(steps)) == ("completed", "completed", 1)


async def test_an_error_arriving_after_the_cancel_ends_cancelled(ctx, claimed, fetch):
    async def cancel_then_error(probe, index, i):
        if i == 1:
            signal.cancel()
            fail("connection reset while closing", retryable=False)

    signal = CancelSignal()
    ctx.provider_for = lambda run: Probe([(TEXT, {})], on_stream=cancel_then_error)
    run = await claimed()
    outcome = await asyncio.wait_for(execute(run, signal=signal, ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, row.error_class) == ("cancelled", "cancelled", "")
    assert outcome.status == "cancelled" and steps == []
    assert ctx.breakers.get("probe").failures == 0 and ctx.stats.stream_failures == 0


async def test_cancel_leaves_the_breaker_alone_while_failures_open_it(ctx, claimed, fetch):
    async def fire_then_hang(probe, index, i):
        if i == 1:
            asyncio.get_running_loop().call_soon(signal.cancel)
            await hang()

    breaker = ctx.breakers.get("probe")
    signal = CancelSignal()
    for _ in range(ctx.config.breaker_threshold + 1):
        ctx.provider_for = lambda run: Probe([(TEXT, {})], on_stream=fire_then_hang)
        assert (await asyncio.wait_for(execute(await claimed(), signal=signal, ctx=ctx), 10)).status == "cancelled"
    assert (breaker.failures, breaker.opened_at) == (0, None)
    assert (ctx.stats.provider_failures, ctx.stats.stream_failures) == (0, 0)

    async def broken(probe, index, i=0):
        fail("503")

    ctx.config = dataclasses.replace(ctx.config, retries=0)
    for _ in range(ctx.config.breaker_threshold):
        ctx.provider_for = lambda run: Probe([(TEXT, {})], on_stream=broken, on_complete=broken)
        assert (await asyncio.wait_for(execute(await claimed(), signal=signal, ctx=ctx), 10)).reason == "provider_failed"
    assert breaker.opened_at is not None
    # Open: the next run fails fast without calling the provider.
    probe = Probe([(TEXT, {})])
    ctx.provider_for = lambda run: probe
    run = await claimed()
    outcome = await asyncio.wait_for(execute(run, signal=signal, ctx=ctx), 10)
    assert (outcome.reason, outcome.error_class, probe.stream_calls) == ("provider_failed", "CircuitOpen", 0)


async def test_queued_inputs_are_resolved_once_when_the_run_is_cancelled(ctx, claimed, fetch, pool):
    run = await claimed(script=[{"ask_approval": {"tool": "echo", "args": {"x": 1}}}])
    assert await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 5) is outcomes.PARKED
    item = (await pool.call(transitions.queue_input, run.id, kind="message", payload={"text": "hi"}, by="op")).created
    # Released while it waits: nobody holds it to notice a cancel, so it settles at once.
    assert await pool.call(transitions.request_cancel, run.id, by="op") == transitions.CancelOutcome.SETTLED
    assert not await pool.call(transitions.settle, run.id, status="cancelled", reason="cancelled", worker="w-test")
    row, steps, kinds, by_kind = await fetch(run.id)
    assert (row.status, row.termination_reason) == ("cancelled", "cancelled")
    stored = await pool.call(RunInput.objects.get, pk=item.pk)
    assert (stored.status, stored.resolution) == ("cancelled", "interrupted")
    assert kinds.count("input_cancelled") == 1 and by_kind["input_cancelled"][0]["inputs"] == [item.pk]


async def test_script_end_completes(ctx, claimed, fetch):
    run = await claimed(script=[say(4), say(2)])
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, row.truncated, row.steps) == ("completed", "completed", False, 2)
    assert row.tokens_out == 6 and row.cost > 0


async def test_iteration_cap_completes_truncated(ctx, claimed, fetch):
    run = await claimed(script=[say(2)] * 5, max_iterations=2)
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, row.truncated, len(steps)) == ("completed", "max_iterations", True, 2)


async def test_token_budget_completes_truncated(ctx, claimed, fetch):
    run = await claimed(script=[say(20)] * 5, token_budget=40)
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, kinds, data = await fetch(run.id)
    assert (row.status, row.termination_reason, row.truncated) == ("completed", "budget_exhausted", True)
    assert 0 < len(steps) < 5 and row.tokens_in + row.tokens_out >= 40
    # The server asked the stop as the step reaching it committed; the worker stopped at its
    # next checkpoint, before another model call: nothing was started, so nothing discarded.
    assert data["stop_requested"][0]["limit"] == "tokens"
    assert kinds == ["created", "claimed", *["step_committed"] * len(steps), "stop_requested", "settled"]


async def test_tool_call_budget_stops_the_run_truncated(ctx, claimed, fetch):
    tools = {"tools": [{"name": "echo", "args": {"text": "x"}}]}
    run = await claimed(script=[tools] * 5, tool_call_budget=2)
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, data = await fetch(run.id)
    assert (row.status, row.termination_reason, row.truncated, row.tool_calls) == (
        "completed", "budget_exhausted", True, 2,
    )
    assert len(steps) == 2 and data["stop_requested"][0]["limit"] == "tool_calls"


async def test_a_budget_raised_mid_run_is_the_one_enforced(ctx, claimed, fetch, pool):
    run = await claimed(script=[say(20)] * 4, token_budget=10)
    # Raised after the claim, before the first commit: the engine keeps no copy of it.
    await pool.call(lambda: Run.objects.filter(pk=run.pk).update(token_budget=10_000))
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, kinds, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, len(steps)) == ("completed", "completed", 4)
    assert "stop_requested" not in kinds


async def test_policy_denial_fails_the_run(ctx, claimed, fetch):
    run = await claimed(script=[say(2), {"tools": [{"name": "shell", "args": {"cmd": "rm -rf /"}}]}])
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, kinds, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, len(steps)) == ("failed", "policy_denied", 1)
    assert "not allowed" in row.error_message and "step_discarded" in kinds


async def test_provider_failure_after_retries_fails_with_class_and_safe_message(ctx, claimed, fetch):
    run = await claimed(script=[say(2), {"fail": "provider"}])
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, len(steps)) == ("failed", "provider_failed", 1)
    assert (row.error_class, row.error_message) == ("ScriptedProviderError", "scripted provider failure")
    assert ctx.stats.provider_failures == ctx.config.retries + 1


async def test_a_broken_stream_falls_back_to_a_plain_request(ctx, claimed, fetch):
    run = await claimed(script=[{"say": "a b c d", "fail": "stream"}])
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, steps[0].text, ctx.stats.stream_failures) == ("completed", "a b c d", 1)


async def test_a_failure_while_a_cancel_request_is_pending_settles_cancelled(ctx, claimed, fetch, pool):
    # The request is in the row but has not reached the worker (no fast path, no beat
    # yet) when the provider fails: the run still ends cancelled, not failed.
    from runs.agent.fastpath import FastPath

    ctx.fastpath = FastPath.off()  # no channel layer at all
    ctx.config = dataclasses.replace(ctx.config, heartbeat_s=60, retries=0)
    run = await claimed()

    async def requested_then_broken(probe, index, i=0):
        await pool.call(transitions.request_cancel, run.id, by="op")
        fail("503", retryable=False)

    ctx.provider_for = lambda r: Probe([(TEXT, {})], on_stream=requested_then_broken, on_complete=broken_fallback)
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, steps) == ("cancelled", "cancelled", [])


async def broken_fallback(probe, index):
    fail("503", retryable=False)


async def test_a_slow_tool_times_out_into_an_error_result_and_the_run_goes_on(ctx, claimed, fetch):
    ctx.config = dataclasses.replace(ctx.config, tool_timeout_s=0.05)
    run = await claimed(script=[{"tools": [{"name": "sleep", "args": {"seconds": 30}}, {"name": "nope"}]}, say(2)])
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, row.termination_reason, len(steps)) == ("completed", "completed", 2)
    slow, unknown = steps[0].tool_calls
    assert "timed out" in slow["error"] and "unknown tool" in unknown["error"]
    assert "result" not in slow and "result" not in unknown


async def test_a_passed_deadline_is_stopped_by_the_runs_own_worker_with_the_watchdogs_note(ctx, claimed, fetch):
    from datetime import timedelta

    from django.utils import timezone

    run = await claimed(script=[say(400, 10)], deadline=timezone.now() + timedelta(milliseconds=200))
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 5)
    row, *_ = await fetch(run.id)
    # The wall-clock budget is spent: truncated, not cancelled.
    assert (row.status, row.termination_reason, row.truncated, row.cancel_source) == (
        "completed", "budget_exhausted", True, "worker",
    )
    assert (row.cancel_requested_by, row.cancel_note, row.stop_reason) == (ctx.worker_id, "deadline passed",
                                                                             "budget_exhausted")


async def test_a_worker_whose_clock_runs_ahead_does_not_cancel_before_the_database_says_so(
    ctx, claimed, fetch, monkeypatch
):
    from datetime import timedelta
    from types import SimpleNamespace

    from django.utils import timezone

    from runs import watchdog
    from runs.agent import heartbeats

    real = timezone.now
    # The worker's clock is two hours ahead: by it, the deadline an hour away has passed.
    monkeypatch.setattr(heartbeats, "timezone", SimpleNamespace(now=lambda: real() + timedelta(hours=2)))
    asked, rule = [], watchdog.stop_past_deadline
    monkeypatch.setattr(watchdog, "stop_past_deadline", lambda *a, **k: asked.append(a) or rule(*a, **k))
    run = await claimed(script=[say(30, 10)], deadline=real() + timedelta(hours=1))  # ~0.3 s of work
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 5)
    row, *_ = await fetch(run.id)
    assert asked  # the worker did ask; the database's clock said no
    assert (row.status, row.cancel_requested_at) == ("completed", None)


async def test_an_open_breaker_half_opens_after_its_reset_time():
    from runs.agent.breaker import Breaker

    now = [0.0]
    breaker = Breaker("p", threshold=2, reset_s=10, clock=lambda: now[0])
    breaker.record_failure()
    assert breaker.allow() and breaker.opened_at is None
    breaker.record_failure()
    assert breaker.opened_at is not None and not breaker.allow()
    now[0] = 10.0
    assert breaker.allow()  # half-open: a trial may go
    breaker.record_failure()  # the trial failed: open again, for another reset_s
    assert not breaker.allow()
    now[0] = 20.0
    breaker.record_success()
    assert breaker.allow() and breaker.opened_at is None and breaker.failures == 0
