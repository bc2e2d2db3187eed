"""The `openai` provider against a fake OpenAI-compatible server on loopback."""

import asyncio

import pytest
from channels.layers import get_channel_layer

from runs import groups
from runs.agent.cancel import CancelSignal
from runs.agent.providers.openai import OpenAIProvider
from runs.agent.runner import execute
from tests.runs.agent.fake_openai import FakeOpenAI, sse

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

USAGE = {"prompt_tokens": 11, "completion_tokens": 7}


def use(ctx, server, **kwargs):
    ctx.provider_for = lambda run: OpenAIProvider(base_url=server.base_url, api_key="sk-test", model="m", **kwargs)


async def test_streamed_reply_becomes_a_committed_step(ctx, claimed, fetch):
    async with FakeOpenAI([("stream", sse("Hello", " world", usage=USAGE))]) as server:
        use(ctx, server)
        run = await claimed(agent="openai")
        await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, row.termination_reason) == ("completed", "completed")
    assert [s.text for s in steps] == ["Hello world"]
    assert (row.tokens_in, row.tokens_out) == (11, 7)
    headers, body = server.requests[0]
    assert headers["authorization"] == "Bearer sk-test"
    assert body["stream"] is True and body["model"] == "m"
    assert {t["function"]["name"] for t in body["tools"]} >= {"echo", "sleep", "write_file"}


async def test_streamed_tool_calls_run_and_their_results_go_back_to_the_model(ctx, claimed, fetch):
    call = [
        {"index": 0, "id": "call_1", "function": {"name": "echo", "arguments": '{"city": '}},
        {"index": 0, "function": {"arguments": '"Oslo"}'}},
    ]
    responses = [("stream", sse("Checking.", *call, usage=USAGE)), ("stream", sse("It is Oslo.", usage=USAGE))]
    async with FakeOpenAI(responses) as server:
        use(ctx, server)
        run = await claimed(agent="openai")
        await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert row.status == "completed"
    assert steps[0].kind == "tool_calls" and steps[0].text == "Checking."
    assert steps[0].tool_calls == [{"id": "call_1", "name": "echo", "args": {"city": "Oslo"}, "result": {"city": "Oslo"}}]
    assert steps[1].text == "It is Oslo."
    history = server.requests[1][1]["messages"]
    assert history[-2]["tool_calls"][0]["id"] == "call_1"
    assert history[-1] == {"role": "tool", "tool_call_id": "call_1", "content": '{"city": "Oslo"}'}


async def test_server_errors_are_retried_with_backoff_then_succeed(ctx, claimed, fetch):
    responses = [("status", 500), ("stream", sse("Recovered", usage=USAGE))]
    async with FakeOpenAI(responses) as server:
        use(ctx, server)
        run = await claimed(agent="openai")
        await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, [s.text for s in steps]) == ("completed", ["Recovered"])
    # An error status is the server's answer, not a broken stream: retried, never rescued.
    assert [body["stream"] for _, body in server.requests] == [True, True]
    assert ctx.stats.provider_failures == 1 and ctx.stats.stream_failures == 0
    assert ctx.breakers.get("openai").failures == 0


async def test_a_429_waits_for_retry_after_then_asks_once_more(ctx, claimed, fetch):
    import dataclasses

    ctx.config = dataclasses.replace(ctx.config, backoff_base_s=0.001, backoff_max_s=0.001)
    responses = [("status", 429, {"Retry-After": "0.3"}), ("stream", sse("Later", usage=USAGE))]
    async with FakeOpenAI(responses) as server:
        use(ctx, server)
        run = await claimed(agent="openai")
        await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, [s.text for s in steps]) == ("completed", ["Later"])
    assert [body["stream"] for _, body in server.requests] == [True, True]  # no rescue request
    assert server.gaps[1] >= 0.3  # the provider's Retry-After, not the 1 ms backoff


async def test_a_cancel_during_a_retry_after_wait_ends_cancelled_without_asking_again(ctx, claimed, fetch):
    signal = CancelSignal()
    async with FakeOpenAI([("status", 429, {"Retry-After": "60"})]) as server:
        use(ctx, server)
        run = await claimed(agent="openai")
        task = asyncio.ensure_future(execute(run, signal=signal, ctx=ctx))
        await asyncio.wait_for(server.answered.wait(), 10)
        signal.cancel()
        outcome = await asyncio.wait_for(task, 10)  # far less than the 60 s asked for
    row, *_ = await fetch(run.id)
    assert outcome.status == "cancelled" and (row.status, row.termination_reason) == ("cancelled", "cancelled")
    assert len(server.requests) == 1
    assert ctx.breakers.get("openai").failures == 0


async def test_client_errors_are_not_retried(ctx, claimed, fetch):
    async with FakeOpenAI([("status", 401)]) as server:
        use(ctx, server)
        run = await claimed(agent="openai")
        await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, *_ = await fetch(run.id)
    assert (row.status, row.termination_reason, row.error_class) == ("failed", "provider_failed", "HTTP401")
    assert len(server.requests) == 1  # no retry, and no non-streaming "rescue" of a 4xx


async def test_cancel_mid_stream_hangs_up_and_discards_the_step(ctx, claimed, fetch):
    layer = get_channel_layer()
    signal = CancelSignal()
    async with FakeOpenAI([("stream", sse("Hello", " there", " and more"), 2)]) as server:
        use(ctx, server)
        run = await claimed(agent="openai")
        viewer = await layer.new_channel()
        await layer.group_add(groups.viewers(run.id), viewer)
        task = asyncio.ensure_future(execute(run, signal=signal, ctx=ctx))
        seen = ""
        while seen != "Hello there":  # what a viewer sees streaming
            message = await asyncio.wait_for(layer.receive(viewer), 5)
            assert message["offset"] == len(seen)
            seen += message["text"]
        signal.cancel()
        outcome = await asyncio.wait_for(task, 2)
        await asyncio.wait_for(server.hung_up.wait(), 2)  # the HTTP stream was dropped
    row, steps, _, by_kind = await fetch(run.id)
    assert outcome.status == "cancelled" and (row.status, row.termination_reason) == ("cancelled", "cancelled")
    assert steps == [] and by_kind["step_discarded"][0]["text"] == "Hello there"
    # Usage never came (the stream was dropped): the spend is estimated, ~4 chars a token.
    assert by_kind["step_discarded"][0]["estimated"] is True and row.tokens_out == 3 > 0
    assert ctx.breakers.get("openai").failures == 0 and ctx.stats.stream_failures == 0


async def test_a_stalled_stream_hits_its_deadline_and_falls_back(ctx, claimed, fetch):
    import dataclasses

    ctx.config = dataclasses.replace(ctx.config, stream_idle_s=0.2)
    body = {"choices": [{"message": {"content": "From fallback"}}], "usage": USAGE}
    async with FakeOpenAI([("stream", sse("Hel", "lo"), 1), ("json", body)]) as server:
        use(ctx, server)
        run = await claimed(agent="openai")
        await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    row, steps, _, _ = await fetch(run.id)
    assert (row.status, [s.text for s in steps]) == ("completed", ["From fallback"])
    assert ctx.stats.stream_failures == 1
