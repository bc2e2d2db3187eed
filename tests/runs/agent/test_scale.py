"""At fleet scale with real processes: 2 `run_agents` workers and 1 daphne server as
subprocesses, 200 scripted runs live at once, a random half cancelled (some through
the server's abort view over HTTP, the rest through the transitions), and WebSocket
viewers on a few run pages.

Every run ends exactly once (one `settled` event), every cancelled run ends cancelled,
the others complete, and what each viewer's page shows equals the committed steps.
PostgreSQL + Redis only: on the embedded default there is no layer shared by processes.
No wall-clock bound but a generous overall timeout; timings are for bench_cancel.
"""

import asyncio
import os
import random

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.utils.crypto import get_random_string
from django.test import Client

from dashboard.wsviewer import RunPageViewer
from runs import benchkit, groups, transitions
from runs.models import Run, RunEvent, Step

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

RUNS = 200
OVERALL_S = 120  # generous: the whole scenario takes ~15-30 s on a loaded 2-core machine
VIA_HTTP = 10  # of the cancels, through the server's abort view
WATCH_KEPT, WATCH_CANCELLED = 4, 2


def words(n, tag):
    return " ".join(f"{tag}{i}" for i in range(n))


def kept_script():
    # Two streamed steps, ~1.2 s each at the default pace: the run completes.
    return [{"say": words(30, "a"), "token_delay_ms": 40}, {"say": words(30, "b"), "token_delay_ms": 40}]


def doomed_script():
    # Long enough (~10 s) that a cancel sent within 1 s of the claim, even one carried
    # by the heartbeat on a loaded machine, finds the run still streaming.
    return [{"say": words(60, "c"), "token_delay_ms": 40}, {"say": words(200, "d"), "token_delay_ms": 40}]


@pytest.fixture
def fleet(postgres, tmp_path):
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL")
    name = connection.settings_dict["NAME"]
    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    fleet = benchkit.Fleet(
        lambda app, **extra: benchkit.child_env(
            name, prefix, app, RUNWARDEN_WORKSPACE=tmp_path / "ws", **extra
        ),
        tmp_path,
    )
    yield fleet
    fleet.stop(graceful=True)


@database_sync_to_async
def setup_runs(rng):
    user = User.objects.create_user("scale-operator", password=os.urandom(8).hex())
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "cancel_run"]))
    client = Client()
    client.force_login(user)
    doomed = set(rng.sample(range(RUNS), RUNS // 2))
    runs = [
        transitions.create_run(agent="scripted", title=f"scale {i}",
                               input={"script": doomed_script() if i in doomed else kept_script()}).id
        for i in range(RUNS)
    ]
    return client.cookies["sessionid"].value, runs, {runs[i] for i in doomed}


@database_sync_to_async
def running(run_ids):
    return set(Run.objects.filter(pk__in=run_ids).exclude(status="queued").values_list("pk", flat=True))


@database_sync_to_async
def still_live(run_ids):
    return Run.objects.filter(pk__in=run_ids, status__in=Run.NON_TERMINAL).count()


@database_sync_to_async
def committed_steps(run_id):
    return {s.index: s.text for s in Step.objects.filter(run_id=run_id)}


async def wait_for(predicate, what, events, timeout):
    """Re-check `predicate` (on the database: the workers are other processes) each
    time the run list's group announces a change, or at the latest every half second."""
    async with asyncio.timeout(timeout):
        while not await predicate():
            try:
                await asyncio.wait_for(events.get(), 0.5)
            except TimeoutError:
                pass
    return what


async def test_200_live_runs_on_two_workers_end_once_and_viewers_match_the_steps(fleet):
    rng = random.Random(int(os.environ.get("RUNWARDEN_SCALE_SEED", random.randrange(1 << 30))))
    session, run_ids, doomed = await setup_runs(rng)
    kept = [r for r in run_ids if r not in doomed]
    watched = rng.sample(kept, WATCH_KEPT) + rng.sample(sorted(doomed), WATCH_CANCELLED)

    # The run list's group: each claim and settle is announced there; it wakes our checks.
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(groups.LIST_GROUP, channel)
    events = asyncio.Queue()
    listener = asyncio.ensure_future(_pump(layer, channel, events))

    _, port = await asyncio.to_thread(fleet.start_server)
    csrf = get_random_string(32)  # a CSRF secret: the cookie and the header carry the same
    cookie = f"sessionid={session}; csrftoken={csrf}"
    viewers = [RunPageViewer(f"ws://127.0.0.1:{port}", run_id, cookie) for run_id in watched]
    await asyncio.gather(*(v.connect() for v in viewers))
    readers = [asyncio.ensure_future(v.read()) for v in viewers]
    try:
        async with asyncio.timeout(OVERALL_S):
            # Viewers are on their pages before any run starts: they see every delta.
            await asyncio.to_thread(fleet.start_worker, "scale-0", RUNS // 2)
            await asyncio.to_thread(fleet.start_worker, "scale-1", RUNS // 2)
            answers = await cancel_at_random_moments(rng, doomed, port, cookie, csrf, events)
            await wait_for(lambda: _none_live(run_ids), "every run ended", events, OVERALL_S)
    finally:
        listener.cancel()
        await layer.group_discard(groups.LIST_GROUP, channel)

    assert set(answers.values()) == {202}, answers  # the abort view: 202 requested
    rows = await database_sync_to_async(lambda: {
        r.id: (r.status, r.termination_reason) for r in Run.objects.filter(pk__in=run_ids)
    })()
    for run_id in run_ids:
        expected = ("cancelled", "cancelled") if run_id in doomed else ("completed", "completed")
        assert rows[run_id] == expected, run_id
    settled = await database_sync_to_async(lambda: list(
        RunEvent.objects.filter(run_id__in=run_ids, kind="settled").values_list("run_id", flat=True)
    ))()
    assert sorted(settled) == sorted(run_ids)  # each run exactly once
    ignored = await database_sync_to_async(
        lambda: RunEvent.objects.filter(run_id__in=run_ids, kind="late_settle_ignored").count()
    )()
    assert ignored == 0

    # A worker that dropped a batch of deltas (it logs so): the pages still end on the
    # committed steps (checked below), but that batch's text never streamed, so "every
    # step streamed" is only required when no worker logged a drop.
    logs = benchkit.read_logs(fleet.worker_logs)
    fast_path_stayed_up = not any(drop in logs for drop in ("live deltas dropped", "fast path unavailable"))
    for viewer in viewers:
        steps = await committed_steps(viewer.run_id)
        await viewer.until(lambda v=viewer, s=steps: v.steps == s, timeout=30)
        assert viewer.steps == steps  # the page shows exactly the committed steps
        for index, text in viewer.streamed.items():
            # What streamed in before the commit: the step's text, never more or other.
            assert steps[index].startswith(text), (viewer.run_id, index)
        if viewer.run_id not in {str(r) for r in doomed}:
            assert len(steps) == 2
            if fast_path_stayed_up:
                # Every step streamed in before its commit (the last delta may lose the
                # race with the commit's refresh: hence a prefix, above, not equality).
                assert all(viewer.streamed.get(i) for i in steps), (viewer.run_id, viewer.streamed)
    for viewer in viewers:
        await viewer.close()
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)


async def _pump(layer, channel, events):
    while True:
        events.put_nowait(await layer.receive(channel))


async def _none_live(run_ids):
    return await still_live(run_ids) == 0


async def cancel_at_random_moments(rng, doomed, port, cookie, csrf, events):
    """Cancel each doomed run a random 0.1-1.0 s after a worker claimed it; the first
    VIA_HTTP through the abort view, as the dashboard's button does. Returns the HTTP
    answers' status codes."""
    pending, tasks, answers = set(doomed), [], {}
    http_ids = set(sorted(doomed)[:VIA_HTTP])
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

        async def cancel_later(run_id):
            await asyncio.sleep(rng.uniform(0.1, 1.0))  # the random moment is the point of the test
            if run_id in http_ids:
                response = await client.post(
                    f"/runs/{run_id}/cancel", data={"note": "scale"},
                    headers={"Cookie": cookie, "X-CSRFToken": csrf, "HX-Request": "true"},
                )
                answers[run_id] = response.status_code
            else:
                assert await database_sync_to_async(transitions.request_cancel)(run_id, by="scale", source="api") == "requested"

        async def claimed():
            started = await running(pending)
            for run_id in started:
                tasks.append(asyncio.ensure_future(cancel_later(run_id)))
            pending.difference_update(started)
            return not pending

        await wait_for(claimed, "every doomed run claimed", events, OVERALL_S)
        await asyncio.gather(*tasks)
    return answers
