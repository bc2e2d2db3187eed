"""A guardrail's stop in the Python clients against a real server: heard on each path
(long-poll, heartbeat, events batch, a step's 409) as `Stopped` with its reason, and
the run settled as the stop says — completed/budget_exhausted truncated, or
failed/policy_denied — never cancelled. The server's budget check asks the stop."""

import asyncio

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async

from runs import transitions
from runs.models import Run, RunEvent, Step
from runwarden_client import Cancelled, Client, Stopped
from runwarden_client.aio import AsyncClient
from tests.clients.conftest import discarded

BUDGET, POLICY = Run.TerminationReason.BUDGET_EXHAUSTED, Run.TerminationReason.POLICY_DENIED


def ending(run_id):
    row = Run.objects.get(pk=run_id)
    return row.status, row.termination_reason, row.truncated


def stop(run_id, reason=BUDGET, limit="tokens"):
    assert transitions.request_stop(run_id, reason=reason, limit=limit, note="test stop") == transitions.StopOutcome.REQUESTED


@pytest.fixture
def client(live_server_url, agent_key):
    with Client(live_server_url, agent_key, flush_s=0.02, heartbeat_s=0.2) as api:
        yield api


@pytest.mark.django_db(transaction=True)
def test_streaming_past_the_token_budget_is_stopped_and_ends_budget_exhausted(client):
    seen = []
    with client.run("client-budget", token_budget=30) as run:
        try:
            while True:  # a greedy agent: it never looks at its own spend
                run.stream("tick ")
                run.usage(tokens_in=5, tokens_out=5)
                run.step()
        except Stopped as stopped:
            seen.append(stopped)
            raise
    (stopped,) = seen
    assert (stopped.reason, isinstance(stopped, Cancelled)) == ("budget_exhausted", True)
    assert ending(run.id) == ("completed", "budget_exhausted", True)
    assert run.settled == {"settled": True, "status": "completed", "reason": "budget_exhausted"}
    assert Step.objects.filter(run_id=run.id).count() == 3  # 30 tokens: the third step reached the budget
    (event,) = RunEvent.objects.filter(run_id=run.id, kind=RunEvent.Kind.STOP_REQUESTED)
    assert (event.data["reason"], event.data["limit"]) == ("budget_exhausted", "tokens")
    assert not RunEvent.objects.filter(run_id=run.id, kind=RunEvent.Kind.CANCEL_REQUESTED).exists()  # a stop, not an abort


@pytest.mark.django_db(transaction=True)
def test_a_stop_the_body_caught_still_settles_as_the_stop_says(client):
    with client.run("client-budget") as run:
        stop(run.id, POLICY, "loop")
        with pytest.raises(Stopped) as caught:
            while True:  # the long-poll or a heartbeat brings it
                run.checkpoint()
                run._stopped.wait(0.01)
        # The body goes on to return, but it had been told to stop: not a completion.
    assert caught.value.reason == "policy_denied"
    assert ending(run.id) == ("failed", "policy_denied", False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["heartbeat", "events", "step"])
def test_each_answer_that_carries_a_cancel_names_the_stop(client, path):
    # The run's background threads are not started (no `with`): only `path` can hear it.
    run = client.run("client-budget")
    run.stream("half a thought")
    run.usage(tokens_out=7)
    stop(run.id)
    with pytest.raises(Stopped) as heard:
        if path == "heartbeat":
            run._heartbeat()
        elif path == "events":
            with run._send:
                run._flush_locked()
        else:
            run.step()
        run.checkpoint()
    assert heard.value.reason == "budget_exhausted"
    run._discard("cancelled")  # what `with` does on the way out
    run._settle_stopped(heard.value)
    assert ending(run.id) == ("completed", "budget_exhausted", True)
    (trace,) = discarded(run.id)  # the step in flight was discarded, never committed
    assert (trace["text"], trace["tokens_out"]) == ("half a thought", 7)


@pytest_asyncio.fixture
async def aclient(live_server_url, agent_key):
    async with AsyncClient(live_server_url, agent_key, flush_s=0.02, heartbeat_s=0.2) as api:
        yield api


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_async_client_is_interrupted_by_a_budget_stop(aclient):
    async with await aclient.run("client-budget-aio", token_budget=20) as run:
        await run.step("a", tokens_out=25)  # over budget: the server asks the stop
        await asyncio.sleep(60)  # interrupted at this await, not at a checkpoint
    assert isinstance(run.signal.reason, Stopped) and run.signal.reason.reason == "budget_exhausted"
    assert await sync_to_async(ending)(run.id) == ("completed", "budget_exhausted", True)
