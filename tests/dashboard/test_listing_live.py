"""The list socket's catch-up and filters: only rows the page can show, removals for
rows that stopped matching."""

import re

import pytest
from channels.db import database_sync_to_async

from dashboard import listing
from runs import transitions
from tests.dashboard.test_consumers import connected, frame_with

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
RUNS = 120  # more than two pages


@database_sync_to_async
def many_runs(n):
    return [transitions.create_run(agent="scripted", title=f"run {i}").id for i in range(n)]


@database_sync_to_async
def first_page_and_cursor():
    """What the page renders: the rows, the resume point (taken before them) and the oldest row's cursor."""
    since = listing.last_event_id()
    rows, more = listing.page(listing.Filters())
    return [r.pk for r in rows], since, listing.encode_cursor(rows[-1]), more


@database_sync_to_async
def touch(run_ids):
    """An event on each run (a claim), as a worker picking them up makes."""
    for run_id in run_ids:
        assert transitions.claim(run_id, worker="w1")


async def test_catch_up_sends_only_rows_the_first_page_can_show(operator):
    ids = await many_runs(RUNS)
    shown, since, oldest, more = await first_page_and_cursor()
    assert len(shown) == listing.PAGE_SIZE and more
    await touch(ids[:40])  # older runs (pages 2 and 3) change after the render
    await touch([shown[0]])
    ws = await connected(f"/ws/runs/?page=1&since={since}&oldest={oldest}", operator)
    text = await frame_with(ws, str(shown[0]))
    sent = set(re.findall(r'<div role="row" id="run-([0-9a-f-]{36})"', text))
    assert sent and sent <= {str(run_id) for run_id in shown}  # nothing from later pages
    assert str(ids[0]) not in sent
    await ws.disconnect()


async def test_catch_up_bounds_are_ignored_when_unreadable(operator):
    run_id = (await many_runs(1))[0]
    ws = await connected("/ws/runs/?page=1&since=0&oldest=%%%&newest=garbage", operator)
    assert str(run_id) in await frame_with(ws, str(run_id))
    await ws.disconnect()


async def test_a_row_that_stops_matching_the_filters_is_sent_as_a_removal(operator):
    run_id = (await many_runs(1))[0]
    ws = await connected("/ws/runs/?page=1&status=queued", operator)
    await touch([run_id])  # now running: no longer "queued"
    text = await frame_with(ws, str(run_id))
    assert f'<div id="run-{run_id}" data-remove></div>' in text and 'data-testid="run-row"' not in text
    await ws.disconnect()


async def test_a_search_filter_keeps_matching_rows(operator):
    run_id = (await many_runs(1))[0]
    ws = await connected("/ws/runs/?page=1&q=run+0", operator)
    await touch([run_id])
    text = await frame_with(ws, str(run_id))
    assert 'data-testid="run-row"' in text and "data-remove" not in text
    await ws.disconnect()
