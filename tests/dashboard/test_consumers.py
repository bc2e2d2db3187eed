"""The live sockets, through the real ASGI stack (Origin check, session, router)."""

import asyncio
import re

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from dashboard import consumers, runview
from dashboard.asgi import application
from runs import groups, transitions
from runs.models import Run
from tests.conftest import claim_new_run
from tests.dashboard.conftest import ORIGIN, session_headers

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
TIMEOUT = 3


@pytest.fixture(autouse=True)
def quiet_heartbeats(monkeypatch):
    """No heartbeat refresh frames unless a test asks for them."""
    monkeypatch.setattr(consumers, "HEARTBEAT_REFRESH_S", 60)
    runview._heartbeats["at"] = 0.0


def communicator(path, headers):
    return WebsocketCommunicator(application, path, headers=headers)


async def connected(path, user):
    headers = await database_sync_to_async(session_headers)(user)
    ws = communicator(path, headers)
    ok, code = await ws.connect(timeout=TIMEOUT)
    assert ok, code
    return ws


async def frame(ws, timeout=TIMEOUT):
    return await ws.receive_from(timeout=timeout)


async def frame_with(ws, needle, timeout=TIMEOUT):
    """The next frame containing `needle` (earlier frames are skipped)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        text = await ws.receive_from(timeout=max(0.01, deadline - loop.time()))
        if needle in text:
            return text


create_run = database_sync_to_async(transitions.create_run)
request_cancel = database_sync_to_async(transitions.request_cancel)
settle = database_sync_to_async(transitions.settle)
commit_step = database_sync_to_async(transitions.commit_step)


async def running_run(title="live one"):
    return await database_sync_to_async(claim_new_run)(title=title)


async def progress(run, step, offset, text, **extra):
    await get_channel_layer().group_send(
        groups.viewers(run.id),
        {"type": "run.progress", "run_id": str(run.id), "step": step, "offset": offset, "text": text, **extra},
    )


# --- who may watch (refusals, origins, logout: test_consumers_access.py) -------------------------


async def test_watcher_may_watch_but_gets_no_buttons(watcher):
    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/", watcher)
    await request_cancel(run.id, by="someone")
    text = await frame_with(ws, 'id="run-header"')
    assert "Aborting…" in text and 'data-testid="abort-button"' not in text and "Read-only" in text
    await ws.disconnect()


# --- the list socket ---------------------------------------------------------------------------


async def test_new_run_is_pushed_as_an_insertable_row(operator):
    ws = await connected("/ws/runs/?page=1", operator)
    run = await create_run(agent="scripted", title="fresh <b>bold</b>")
    text = await frame_with(ws, str(run.id))
    assert 'hx-swap-oob="afterbegin:#run-rows"' in text
    row = re.search(rf'<div role="row" id="run-{run.id}"[^>]*>', text).group(0)
    assert 'data-insert="1"' in row and 'data-testid="run-row"' in row
    assert "fresh &lt;b&gt;bold&lt;/b&gt;" in text and "<b>bold</b>" not in text
    assert 'id="counts" class="counts"' in text and 'hx-swap-oob="true"' in text
    await ws.disconnect()


async def test_rows_outside_the_filters_go_and_older_pages_update_but_do_not_insert(operator):
    filtered = await connected("/ws/runs/?page=1&status=failed", operator)
    older_page = await connected("/ws/runs/?page=0", operator)
    run = await create_run(agent="scripted", title="queued one")
    assert f'<div id="run-{run.id}" data-remove></div>' in await frame_with(filtered, str(run.id))
    assert 'data-insert="0"' in await frame_with(older_page, str(run.id))
    for ws in (filtered, older_page):
        await ws.disconnect()


async def test_row_updates_are_coalesced(operator):
    run = await running_run()
    ws = await connected("/ws/runs/?page=1", operator)
    layer = get_channel_layer()
    message = {"type": "run.changed", "run_id": str(run.id), "status": "running", "seq": 2, "event": "claimed"}
    for _ in range(30):
        await layer.group_send(groups.LIST_GROUP, message)
    frames = [await frame(ws)]
    if not await ws.receive_nothing(timeout=0.6):
        frames.append(await frame(ws))
    assert await ws.receive_nothing(timeout=0.6)
    assert 1 <= len(frames) <= 2  # thirty changes, at most two renders
    await ws.disconnect()


async def test_list_catches_up_what_changed_since_the_page_was_rendered(operator):
    run = await running_run("changed while the page loaded")
    await request_cancel(run.id, by="op")
    ws = await connected("/ws/runs/?page=1&since=0", operator)
    text = await frame_with(ws, str(run.id))
    assert "Aborting…" in text
    await ws.disconnect()


async def test_unknown_message_types_do_not_break_the_socket(operator):
    ws = await connected("/ws/runs/?page=1", operator)
    await get_channel_layer().group_send(groups.LIST_GROUP, {"type": "run.something_new"})
    run = await create_run(agent="scripted", title="after the unknown message")
    assert str(run.id) in await frame_with(ws, str(run.id))
    await ws.disconnect()


# --- the detail socket: streamed text ------------------------------------------------------


async def test_deltas_are_appended_escaped_without_duplicates(operator):
    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    await progress(run, 0, 0, "Hello <script>alert(1)</script>")
    first = await frame_with(ws, 'id="inflight"')
    assert 'data-step="0"' in first and "Hello &lt;script&gt;alert(1)&lt;/script&gt;" in first
    assert "<script>" not in first
    text_so_far = "Hello <script>alert(1)</script>"
    await progress(run, 0, len(text_so_far), " world")
    assert await frame(ws) == '<span id="inflight-text" hx-swap-oob="beforeend"> world</span>'
    # A repeat of what is shown is dropped; an overlap appends only the new part.
    await progress(run, 0, len(text_so_far), " world")
    await progress(run, 0, len(text_so_far) + 3, "rld<img src=x onerror=alert(2)>")
    appended = await frame(ws)
    assert appended == '<span id="inflight-text" hx-swap-oob="beforeend">&lt;img src=x onerror=alert(2)&gt;</span>'
    await ws.disconnect()


async def test_a_gap_asks_the_worker_to_resync_and_the_answer_replaces_the_block(operator, monkeypatch):
    # Unthrottled: the resync every viewer sends on connect must not hide the gap's own.
    monkeypatch.setattr(consumers, "RESYNC_EVERY_S", 0.0)
    run = await running_run()
    layer = get_channel_layer()
    control = await layer.new_channel()
    await layer.group_add(groups.control(run.id), control)
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    # Every new viewer asks once for the in-flight text.
    on_connect = await asyncio.wait_for(layer.receive(control), TIMEOUT)
    assert on_connect["type"] == "run.resync"
    await progress(run, 0, 0, "abc")
    await frame_with(ws, "abc")
    await progress(run, 0, 10, "lost the middle")  # offset 10 > 3 shown: a gap
    asked = await asyncio.wait_for(layer.receive(control), TIMEOUT)  # the gap's own request
    assert asked["type"] == "run.resync" and asked["reply_channel"] == on_connect["reply_channel"]
    assert await ws.receive_nothing(timeout=0.05)  # handled already: the gap's text is not shown
    # The worker answers the viewer's own channel with the whole text.
    await layer.send(asked["reply_channel"], {"type": "run.progress", "run_id": str(run.id), "step": 0, "offset": 0,
                                              "text": "abcdefghijlost the middle", "resync": True})
    text = await frame_with(ws, 'id="inflight"')
    assert "abcdefghijlost the middle" in text and 'hx-swap-oob="true"' in text
    await progress(run, 0, 25, "!")
    assert await frame(ws) == '<span id="inflight-text" hx-swap-oob="beforeend">!</span>'
    await ws.disconnect()


async def test_a_reconnect_resumes_from_the_browsers_offset(operator):
    run = await running_run()
    await progress(run, 0, 0, "nobody listens yet")
    ws = await connected(f"/ws/runs/{run.id}/?seq=2&steps=0&step=0&offset=5", operator)
    # The browser shows "nobod"; this delta starts at 3, so only "y listens" is new.
    await progress(run, 0, 3, "ody listens")
    assert await frame_with(ws, "inflight-text") == (
        '<span id="inflight-text" hx-swap-oob="beforeend">y listens</span>'
    )
    await ws.disconnect()


async def test_tool_wave_is_shown_while_in_flight(operator):
    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    await progress(run, 0, 0, "let me look", tools=[{"id": "1", "name": "search", "state": "started"},
                                                    {"id": "2", "name": "<fetch>", "state": "finished"}])
    text = await frame_with(ws, 'id="inflight-tools"')
    assert "<code>search</code> <span class=\"tool-state\">started</span>" in text
    assert "<code>&lt;fetch&gt;</code> <span class=\"tool-state\">finished</span>" in text
    await ws.disconnect()


# --- the detail socket: committed steps, events, cancel ----------------------------------------


async def test_committed_step_replaces_the_inflight_text(operator):
    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    await progress(run, 0, 0, "thinking")
    await frame_with(ws, "thinking")
    await commit_step(run.id, worker="w1", index=0, kind="message", text="thinking done")
    text = await frame_with(ws, 'id="step-0"')
    assert 'hx-swap-oob="beforeend:#steps"' in text and "thinking done" in text
    assert 'id="inflight" class="inflight idle" data-step="1"' in text
    assert 'data-steps="1"' in text
    # A late delta of the committed step is ignored; the next step streams.
    await progress(run, 0, 8, " late")
    await progress(run, 1, 0, "next")
    text = await frame(ws)
    assert 'data-step="1"' in text and "next" in text and "late" not in text
    await ws.disconnect()


async def test_cancel_shows_cancelling_then_cancelled_live(operator):
    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    await request_cancel(run.id, by="op", note="enough")
    text = await frame_with(ws, 'id="run-header"')
    assert 'data-testid="run-status">running<' in text and "Aborting…" in text
    assert 'data-testid="abort-button"' in text and "disabled" in text
    assert 'class="event k-cancel_requested"' in text and "enough" in text
    await settle(run.id, status="cancelled", reason="cancelled", worker="w1")
    text = await frame_with(ws, 'data-testid="run-status">cancelled<')
    assert "Aborting…" not in text and 'data-testid="abort-button"' not in text
    assert 'id="inflight" class="inflight idle"' in text  # the discarded step is gone
    # Said beside the answers to actions (#outcome), never instead of them.
    assert 'id="ended"' in text and "The run has ended: cancelled at " in text
    assert 'id="outcome"' not in text
    await ws.disconnect()


async def test_reconnect_sends_only_the_events_the_browser_lacks(operator):
    run = await running_run()
    await request_cancel(run.id, by="op")  # seq 3
    await settle(run.id, status="cancelled", reason="cancelled", worker="w1")  # seq 4
    ws = await connected(f"/ws/runs/{run.id}/?seq=2&steps=0", operator)
    text = await frame_with(ws, "beforeend:#timeline")
    assert re.findall(r'id="ev-(\d+)"', text) == ["3", "4"]
    await ws.disconnect()


async def test_heartbeat_ages_are_refreshed_on_a_clock(operator, monkeypatch):
    """Heartbeats are not events: the sockets re-read them, for the list and the run."""
    monkeypatch.setattr(consumers, "HEARTBEAT_REFRESH_S", 0.05)
    run = await running_run()
    other = await running_run("another")
    listing = await connected("/ws/runs/?page=1", operator)
    text = await frame_with(listing, "upsert-sink")
    assert f'id="hb-{run.id}" data-insert="0"' in text and f'id="hb-{other.id}"' in text
    await listing.disconnect()
    detail = await connected(f"/ws/runs/{run.id}/", operator)
    text = await frame_with(detail, "upsert-sink")
    assert f'id="hb-{run.id}"' in text and f'id="hb-{other.id}"' not in text
    await detail.disconnect()
    # A stale heartbeat shows as stuck.
    await database_sync_to_async(
        lambda: Run.objects.filter(pk=run.pk).update(heartbeat_at=Run.objects.get(pk=run.pk).created_at.replace(year=2000))
    )()
    runview._heartbeats["at"] = 0.0
    listing = await connected("/ws/runs/?page=1", operator)
    text = await frame_with(listing, "upsert-sink")
    cell = text[text.index(f'id="hb-{run.id}"'):]
    assert "stuck" in cell[: cell.index("</span></span>") + 14]
    await listing.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_open_sockets_are_counted_for_metrics(operator):
    from runs import metrics

    gauge = metrics.OPEN_WEBSOCKETS.labels(kind="viewer")
    before = gauge._value.get()
    headers = await database_sync_to_async(session_headers)(operator)
    socket = WebsocketCommunicator(application, "/ws/runs/", headers=headers)
    connected, _ = await socket.connect()
    assert connected and gauge._value.get() == before + 1
    await socket.disconnect()
    assert gauge._value.get() == before
