"""The worker in-process: claiming, concurrency, shutdown, lost and dead runs."""

import asyncio
import dataclasses

import pytest
import pytest_asyncio

from runs import transitions
from runs.agent.worker import Worker
from runs.models import Run
from tests.runs.agent.conftest import say, until_status

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def create(pool, script, **kwargs):
    return await pool.call(lambda: transitions.create_run(agent="scripted", input={"script": script}, **kwargs))


@pytest_asyncio.fixture
async def serve(ctx, config, pool):
    """`worker, stop, task = await serve(concurrency=…)`; stopped at teardown."""
    started = []

    async def start(**kwargs):
        worker = Worker("w-test", config=kwargs.pop("config", config), db=pool, fastpath=ctx.fastpath, **kwargs)
        stop = asyncio.Event()
        task = asyncio.ensure_future(worker.serve(stop))
        await asyncio.wait_for(worker.ready.wait(), 5)
        started.append((stop, task))
        return worker, stop, task

    yield start
    for stop, task in started:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_worker_runs_queued_runs_with_bounded_concurrency(serve, pool):
    runs = [await create(pool, [say(10, 5)]) for _ in range(5)]
    worker, stop, task = await serve(concurrency=2)
    peak = 0
    while True:
        live = await pool.call(lambda: Run.objects.filter(status="running").count())
        peak = max(peak, live, len(worker.active))
        if await pool.call(lambda: Run.objects.filter(status="completed").count()) == 5:
            break
        await asyncio.sleep(0.01)
    assert peak <= 2
    stop.set()
    await asyncio.wait_for(task, 5)
    done = await pool.call(lambda: dict(Run.objects.values_list("pk", "status")))
    assert done == {run.id: "completed" for run in runs}


async def test_worker_claims_only_its_agents_and_never_an_external_agents_run(serve, pool, monkeypatch):
    external = await pool.call(lambda: transitions.create_run(agent="billing-bot", title="external"))
    scripted = await create(pool, [say(1)])
    worker, stop, task = await serve()  # default agents: the ones it has providers for
    assert await until_status(pool, scripted.id, "completed")
    stop.set()
    await asyncio.wait_for(task, 5)
    claims = watch_claims(monkeypatch)
    await serve(agents=["openai"])  # the only worker left must not take a scripted run
    late = await create(pool, [say(1)])
    # Its first claims, the later ones surely made after `late` existed (creating it wakes
    # the worker): none took a run.
    seen = [await asyncio.wait_for(claims.get(), 5) for _ in range(4)]
    assert seen == [None] * 4
    assert await until_status(pool, late.id, "queued") == "queued"
    assert await until_status(pool, external.id, "queued") == "queued"


def watch_claims(monkeypatch):
    """A queue of what each `claim_next` of a worker returned (it runs in a pool thread)."""
    loop, claims, real = asyncio.get_running_loop(), asyncio.Queue(), transitions.claim_next

    def claim_next(**kwargs):
        run = real(**kwargs)
        loop.call_soon_threadsafe(claims.put_nowait, run)
        return run

    monkeypatch.setattr(transitions, "claim_next", claim_next)
    return claims


async def test_shutdown_lets_short_runs_finish_and_fails_the_rest_retryably(serve, pool, config):
    config = dataclasses.replace(config, shutdown_grace_s=0.3)
    short = await create(pool, [say(5, 20)])  # ~0.1 s
    long = await create(pool, [say(3), say(500, 20)])  # one committed step, then ~10 s
    waiting = await create(pool, [{"ask_approval": {"tool": "echo", "args": {}}}])
    worker, stop, task = await serve(config=config, concurrency=3)
    await until_status(pool, short.id, "running")
    await until_status(pool, waiting.id, "waiting_for_approval")
    await asyncio.wait_for(_until_async(pool, lambda: Run.objects.get(pk=long.id).steps == 1), 5)
    stop.set()
    late = await create(pool, [say(1)])  # stopping: never claimed
    await asyncio.wait_for(task, 5)
    rows = {r.id: r for r in await pool.call(lambda: list(Run.objects.all()))}
    assert (rows[short.id].status, rows[short.id].termination_reason) == ("completed", "completed")
    row = rows[long.id]
    assert (row.status, row.termination_reason, row.is_retryable) == ("failed", "worker_shutdown", True)
    assert (row.cancel_requested_at, row.cancel_source, row.error_class) == (None, "", "WorkerShutdown")
    # A run waiting for an operator was released, not held: the shutdown leaves it waiting
    # for its answer, which any worker then resumes.
    assert (rows[waiting.id].status, rows[waiting.id].worker) == ("waiting_for_approval", "")
    assert rows[long.id].steps == 1  # the committed step stays; the one streaming is discarded
    discarded = await pool.call(lambda: list(rows[long.id].events.filter(kind="step_discarded").values_list("data", flat=True)))
    assert [(d["index"], d["reason"], d["interrupted"]) for d in discarded] == [(1, "worker shutdown", True)]
    assert rows[late.id].status == "queued"
    retried = await pool.call(transitions.retry, long.id, by="op")
    assert retried is not None and retried.retry_of_id == long.id


async def test_a_run_cancelled_before_the_shutdown_still_ends_cancelled(serve, pool, config):
    config = dataclasses.replace(config, shutdown_grace_s=0.3)
    run = await create(pool, [say(500, 20)])
    worker, stop, task = await serve(config=config)
    await until_status(pool, run.id, "running")
    assert await pool.call(transitions.request_cancel, run.id, by="op") == transitions.CancelOutcome.REQUESTED
    stop.set()
    await asyncio.wait_for(task, 5)
    row = await pool.call(Run.objects.get, pk=run.id)
    assert (row.status, row.termination_reason, row.cancel_source) == ("cancelled", "cancelled", "user")


async def _until_async(pool, predicate):
    while not await pool.call(predicate):
        await asyncio.sleep(0.01)


async def test_a_retired_run_stops_and_its_late_settle_changes_nothing(serve, pool):
    run = await create(pool, [say(500, 20)])
    worker, stop, task = await serve()
    await until_status(pool, run.id, "running")
    await asyncio.wait_for(_until(lambda: worker.active), 5)
    assert await pool.call(transitions.force_cancel, run.id, by="op")
    await asyncio.wait_for(_until(lambda: not worker.active), 5)
    row = await pool.call(Run.objects.get, pk=run.id)
    kinds = await pool.call(lambda: list(row.events.values_list("kind", flat=True)))
    assert (row.status, row.termination_reason) == ("cancelled", "cancelled")
    # The retire's outcome stands and the worker stopped at once. Whether it learned of
    # the retire from the channel (then its settle is refused, leaving a trace) or from a
    # heartbeat (then it knows the run is not its own and does not settle) is a race.
    assert "step_committed" not in kinds and "settled" not in kinds
    assert set(kinds[kinds.index("retired") + 1 :]) <= {"step_discarded", "late_settle_ignored"}


async def test_a_scripted_death_leaves_the_run_running_for_the_reaper(serve, pool, config):
    dead = await create(pool, [say(10, 10), {"die": True}])
    worker, stop, task = await serve()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while await pool.call(lambda: Run.objects.values_list("steps", flat=True).get(pk=dead.id)) < 1:
        assert loop.time() < deadline, "step 0 never committed"
        await asyncio.sleep(0.01)
    await asyncio.wait_for(_until(lambda: not worker.active), 5)  # it "died" at turn 1
    beat = await pool.call(lambda: Run.objects.values_list("heartbeat_at", flat=True).get(pk=dead.id))
    healthy = await create(pool, [say(10, 30)])  # the worker carries on, ~6 heartbeat intervals
    assert await until_status(pool, healthy.id, "completed")
    row = await pool.call(Run.objects.get, pk=dead.id)
    assert (row.status, row.steps) == ("running", 1)  # no settle
    # No more beats. The one already in flight when it "died" may still land (a database
    # call finishes in its thread), so compare two reads taken after it: a second healthy
    # run lasts ~6 more intervals, during which the dead run's heartbeat must not move.
    # (A bound on how late that in-flight beat lands would be a timing test.)
    again = await create(pool, [say(10, 30)])
    assert await until_status(pool, again.id, "completed")
    assert await pool.call(lambda: Run.objects.values_list("heartbeat_at", flat=True).get(pk=dead.id)) == row.heartbeat_at
    assert row.heartbeat_at >= beat


async def _until(predicate):
    while not predicate():
        await asyncio.sleep(0.01)
