"""The engine's runs are watched for loops: a scripted run calling the same tool with the
same arguments thrice is flagged, and under the agent's `stop` policy it ends
failed/policy_denied; the same through `manage.py run_agents` as a real process."""

import asyncio

import pytest
from django.conf import settings

from runs import loops, transitions
from runs.agent.cancel import CancelSignal
from runs.agent.runner import execute
from runs.models import AgentPolicy, Run, RunEvent
from tests.runs.agent.conftest import say
from tests.runs.agent.test_e2e_worker import start_worker, wait_until  # noqa: F401 - the fixture, shared

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = {"name": "echo", "args": {"q": "x"}}


def looping_script(times=3, after=2):
    return [say(3), *({"tools": [SEARCH]} for _ in range(times)), *(say(20, 5) for _ in range(after))]


@pytest.fixture(autouse=True)
def fresh_policies():
    loops.forget()
    yield
    loops.forget()


def flags_of(run_id):
    return [e.data for e in RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.FLAGGED).order_by("seq")]


@pytest.mark.asyncio
async def test_an_engine_run_calling_the_same_tool_thrice_is_flagged_and_goes_on(ctx, claimed, fetch, pool):
    run = await claimed(script=looping_script())
    outcome = await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 20)
    row, steps, kinds, by_kind = await fetch(run.id)
    assert (outcome.status, row.status, row.termination_reason) == ("completed", "completed", "completed")
    assert len(steps) == 6
    (flag,) = by_kind["flagged"]
    assert flag == {"flag": "repeated_tool", "policy": "flag",
                    "evidence": {"tool": "echo", "args": {"q": "x"}, "times": 3, "steps": [1, 2, 3]}}
    # On the timeline right after the step that completed the row.
    assert kinds.index("flagged") > [i for i, k in enumerate(kinds) if k == "step_committed"][3]


@pytest.mark.asyncio
async def test_under_the_stop_policy_the_engine_run_ends_failed_policy_denied(ctx, claimed, fetch, pool):
    await pool.call(lambda: AgentPolicy.objects.create(agent="scripted", loop_policy="stop"))
    run = await claimed(script=looping_script(times=3, after=3))
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 20)
    row, steps, kinds, by_kind = await fetch(run.id)
    assert (row.status, row.termination_reason, row.truncated) == ("failed", "policy_denied", False)
    assert len(steps) == 4  # nothing committed after the stop was asked
    assert by_kind["flagged"][0]["policy"] == "stop"
    (stop,) = by_kind["stop_requested"]
    assert (stop["reason"], stop["limit"]) == ("policy_denied", "loop")
    assert stop["note"] == "repeated_tool: called echo(q='x') 3 times in a row (steps 2–4)"
    assert kinds.index("flagged") < kinds.index("stop_requested") < kinds.index("settled")


def test_a_run_agents_process_flags_and_stops_a_looping_run(start_worker):  # noqa: F811
    AgentPolicy.objects.create(agent="scripted", loop_policy="stop", repeat_limit=4)
    proc, log = start_worker(settings.REDIS_URL or "", worker_id="loops-e2e", concurrency=2)
    stopped = transitions.create_run(agent="scripted", title="loops", input={"script": looping_script(5, 3)})
    short = transitions.create_run(agent="scripted", title="loops", input={"script": looping_script(3, 1)})
    ids = [stopped.id, short.id]
    wait_until(lambda: not Run.objects.filter(pk__in=ids, status__in=Run.NON_TERMINAL).exists(), 60, "both ended")

    row = Run.objects.get(pk=stopped.id)
    assert (row.status, row.termination_reason) == ("failed", "policy_denied"), log.read_text()[-2000:]
    assert row.steps == 5  # the stop came with step 5 (the 4th call); nothing after it
    assert [f["evidence"]["steps"] for f in flags_of(stopped.id)] == [[1, 2, 3, 4]]
    assert RunEvent.objects.filter(run_id=stopped.id, kind="stop_requested", data__limit="loop").count() == 1
    # Three calls are short of this agent's limit of four: no flag, a normal ending.
    other = Run.objects.get(pk=short.id)
    assert (other.status, other.termination_reason, flags_of(other.id)) == ("completed", "completed", [])
