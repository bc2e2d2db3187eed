"""The OpenAI Agents SDK adapter against a real server and the project's fake
OpenAI-compatible server on loopback (chat completions, streamed): a turn streams into
the dashboard and commits, a tool call is committed with its output, and an Abort stops
the agent mid-stream and mid-tool at its next await — the model stream hung up, the tool
abandoned, the run cancelled with the half turn discarded."""

import asyncio

import pytest
import pytest_asyncio
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from asgiref.sync import sync_to_async
from openai import AsyncOpenAI

from runs.models import Run, Step
from runwarden_client.aio import AsyncClient
from runwarden_client.openai_agents import run_streamed, watched
from tests.clients.conftest import discarded, outcome
from tests.runs.agent.fake_openai import FakeOpenAI, sse

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers otherwise
USAGE = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}


def chunks(*parts, usage=None):
    """sse() with the fields a chat.completion.chunk carries, as the SDK reads them."""
    return [{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "fake", **e}
            for e in sse(*parts, usage=usage)]


def model(fake):
    return OpenAIChatCompletionsModel(model="fake", openai_client=AsyncOpenAI(base_url=fake.base_url, api_key="test"))


def tool_call(name, arguments, call_id="call_1"):
    return {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest_asyncio.fixture
async def client(live_server_url, agent_key):
    async with AsyncClient(live_server_url, agent_key, flush_s=0.02, heartbeat_s=0.5) as api:
        yield api


async def test_a_turn_streams_and_commits(client):
    async with FakeOpenAI([("stream", chunks("Hello", " there", usage=USAGE))]) as fake:
        agent = Agent(name="greeter", instructions="greet", model=model(fake))
        async with await client.run("sdk-agent") as run:
            result = Runner.run_streamed(agent, "hi")
            async for _ in watched(run, result):
                pass
    assert result.final_output == "Hello there"
    assert await sync_to_async(outcome)(run.id) == ("completed", "completed")
    steps = await sync_to_async(list)(Step.objects.filter(run_id=run.id).values_list("text", "tokens_in", "tokens_out"))
    assert steps == [("Hello there", 11, 3)]


async def test_a_tool_call_is_committed_with_its_output(client):
    @function_tool
    def lookup(city: str) -> str:
        """The weather of a city."""
        return f"sunny in {city}"

    responses = [("stream", chunks(tool_call("lookup", '{"city": "Oslo"}'))), ("stream", chunks("It is sunny."))]
    async with FakeOpenAI(responses) as fake:
        agent = Agent(name="weather", instructions="use tools", model=model(fake), tools=[lookup])
        async with await client.run("sdk-agent") as run:
            result = await run_streamed(run, agent, "weather in Oslo?")
    assert result.final_output == "It is sunny."
    steps = await sync_to_async(list)(Step.objects.filter(run_id=run.id).order_by("index"))
    assert [s.kind for s in steps] == ["tool_calls", "message"]
    (call,) = steps[0].tool_calls
    assert (call["name"], call["args"], call["result"]) == ("lookup", {"city": "Oslo"}, "sunny in Oslo")


async def abort_when(event, operator, run_holder):
    await event.wait()
    run_id = await sync_to_async(lambda: str(Run.objects.get(agent="sdk-agent").pk))()
    await sync_to_async(operator.abort)(run_id)


async def test_abort_mid_stream_hangs_up_the_model_and_settles_cancelled(client, operator):
    async with FakeOpenAI([("stream", chunks("Once", " upon", " a", " time"), 2)]) as fake:
        agent = Agent(name="teller", instructions="tell", model=model(fake))
        aborting = asyncio.create_task(abort_when(fake.held, operator, None))
        async with await client.run("sdk-agent") as run:
            await run_streamed(run, agent, "a story")
            raise AssertionError("the stream was held open: only the abort ends it")
        await aborting
        await asyncio.wait_for(fake.hung_up.wait(), 10)  # the SDK's request was abandoned
    assert await sync_to_async(outcome)(run.id) == ("cancelled", "cancelled")
    assert not await sync_to_async(Step.objects.filter(run_id=run.id).exists)()
    (trace,) = await sync_to_async(discarded)(run.id)
    assert trace["text"] == "Once upon" and trace["reason"] == "cancelled"


async def test_abort_mid_tool_abandons_the_tool(client, operator):
    entered, finished = asyncio.Event(), []

    @function_tool
    async def crawl(url: str) -> str:
        """Fetch a page (slowly)."""
        entered.set()
        await asyncio.sleep(60)
        finished.append(url)
        return "page"

    async with FakeOpenAI([("stream", chunks(tool_call("crawl", '{"url": "a"}')))]) as fake:
        agent = Agent(name="crawler", instructions="crawl", model=model(fake), tools=[crawl])
        aborting = asyncio.create_task(abort_when(entered, operator, None))
        async with await client.run("sdk-agent") as run:
            await run_streamed(run, agent, "crawl a")
        await aborting
    assert await sync_to_async(outcome)(run.id) == ("cancelled", "cancelled")
    assert not finished and not await sync_to_async(Step.objects.filter(run_id=run.id).exists)()
    assert (await sync_to_async(discarded)(run.id))[0]["tool_calls"] == ["crawl"]
