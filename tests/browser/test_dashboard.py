"""What an operator sees in a real Chromium: live rows, streamed text, honest aborts."""

import asyncio
import re
import threading
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from playwright.sync_api import expect

from runs import groups, transitions
from runs.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def make_user(username, *codenames):
    user = User.objects.create_user(username, password="pw-" + username)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="runs", codename__in=codenames))
    return user


def log_in(page, base, username):
    page.goto(base + "/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill("pw-" + username)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(base + "/")


def wait_live(page):
    expect(page.locator("#live-state")).to_have_text("live")


def mark_page(page):
    """A marker a reload would wipe: proves updates arrived without one."""
    page.evaluate("window.__noReload = true")


def assert_not_reloaded(page):
    assert page.evaluate("window.__noReload") is True


def new_running_run(fleet, title="a live run", worker="w-test", **kwargs):
    run = fleet.call(transitions.create_run, agent=kwargs.pop("agent", "scripted"), title=title, **kwargs)
    assert fleet.call(transitions.claim, run.id, worker=worker)
    return run


async def stream(run_id, step, pieces, start=0):
    """Send `pieces` as the worker's deltas of the in-flight `step`."""
    layer, offset = get_channel_layer(), start
    for piece in pieces:
        await layer.group_send(
            groups.viewers(run_id),
            {"type": "run.progress", "run_id": str(run_id), "step": step, "offset": offset, "text": piece},
        )
        offset += len(piece)
    return offset


async def listen_on_control(run_id):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(groups.control(run_id), channel)
    return channel


async def honour_cancel(run_id, channel, go, worker="w-test"):
    """The worker: hear the cancel on the control group, stop when allowed, settle."""
    layer = get_channel_layer()
    while (await layer.receive(channel))["type"] != "run.cancel":
        pass
    await asyncio.get_running_loop().run_in_executor(None, go.wait, 10)
    return await database_sync_to_async(transitions.settle)(run_id, status="cancelled", reason="cancelled", worker=worker)


async def answer_resyncs(run_id, channel, state):
    """The worker answers every resync with the whole in-flight text."""
    layer = get_channel_layer()
    while True:
        message = await layer.receive(channel)
        if message["type"] == "run.resync":
            await layer.send(message["reply_channel"], {
                "type": "run.progress", "run_id": str(run_id), "step": 0, "offset": 0,
                "text": state["text"], "resync": True,
            })


def test_log_in_and_see_the_live_list(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="visible after login")
    log_in(page, live_server_url, "op")
    wait_live(page)
    row = page.locator(f'[data-testid="run-row"][data-run-id="{run.id}"]')
    expect(row).to_contain_text("visible after login")
    expect(row.get_by_test_id("run-status")).to_have_text("running")


def test_a_new_run_appears_in_the_list_without_a_reload(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    log_in(page, live_server_url, "op")
    wait_live(page)
    mark_page(page)
    run = fleet.call(transitions.create_run, agent="scripted", title="born while you watched")
    row = page.locator(f'[data-testid="run-row"][data-run-id="{run.id}"]')
    expect(row).to_be_visible()
    expect(row.get_by_test_id("run-status")).to_have_text("queued")
    assert page.locator('[data-testid="run-row"]').first.get_attribute("data-run-id") == str(run.id)
    fleet.call(transitions.claim, run.id, worker="w-test")
    expect(row.get_by_test_id("run-status")).to_have_text("running")
    assert page.locator(f'[data-run-id="{run.id}"]').count() == 1
    assert_not_reloaded(page)


def test_the_detail_page_streams_text_word_by_word(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="a chatty agent")
    log_in(page, live_server_url, "op")
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    mark_page(page)
    text = page.get_by_test_id("inflight-text")
    offset = fleet.run(stream(run.id, 0, ["The "]))
    expect(text).to_have_text("The ")
    offset = fleet.run(stream(run.id, 0, ["quick ", "brown "], start=offset))
    expect(text).to_have_text("The quick brown ")
    fleet.run(stream(run.id, 0, ["fox."], start=offset))
    expect(text).to_have_text("The quick brown fox.")
    # Committing the step moves the text from "in flight" to the committed steps.
    fleet.call(transitions.commit_step, run.id, worker="w-test", index=0, kind="message",
               text="The quick brown fox.", tokens_in=12, tokens_out=5)
    expect(page.locator("#step-0")).to_contain_text("The quick brown fox.")
    expect(page.locator("#inflight")).to_be_hidden()
    assert_not_reloaded(page)


def test_abort_confirm_cancelling_then_cancelled_live_and_the_list_follows(page, context, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="to be aborted")
    log_in(page, live_server_url, "op")
    list_page = context.new_page()
    list_page.goto(live_server_url + "/")
    wait_live(list_page)
    mark_page(list_page)
    list_badge = list_page.locator(f'[data-run-id="{run.id}"]').get_by_test_id("run-status")
    expect(list_badge).to_have_text("running")

    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    mark_page(page)
    channel = fleet.run(listen_on_control(run.id))
    go = threading.Event()
    worker = fleet.start(honour_cancel(run.id, channel, go))

    page.get_by_test_id("abort-button").click()
    expect(page.locator("#abort-dialog")).to_be_visible()
    page.locator("#abort-dialog input[name=note]").fill("runaway loop")
    page.get_by_test_id("confirm-abort").click()
    # Honest: the cancel is asked for, the worker has not stopped yet.
    expect(page.get_by_test_id("outcome")).to_contain_text("Abort requested")
    expect(page.get_by_test_id("abort-button")).to_be_disabled()
    expect(page.get_by_test_id("run-status")).to_have_text("running")
    expect(page.locator("#run-header")).to_contain_text("Aborting…")
    expect(list_page.locator(f'[data-run-id="{run.id}"]')).to_contain_text("Aborting…")

    go.set()  # the worker reaches its checkpoint
    # Generous waits: what matters is that the page turns cancelled by itself (live), not
    # how fast a loaded machine gets there (that is bench_live's and bench_cancel's job).
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled", timeout=20_000)
    assert worker.result(20) == "settled"  # SettleOutcome.SETTLED
    expect(list_badge).to_have_text("cancelled", timeout=20_000)
    expect(page.locator("#run-header")).not_to_contain_text("Aborting…")
    expect(page.get_by_test_id("ended")).to_contain_text("The run has ended: cancelled")
    expect(page.get_by_test_id("outcome")).to_contain_text("Abort requested")  # the answer stays
    expect(page.get_by_test_id("abort-button")).to_have_count(0)
    expect(page.locator("#timeline")).to_contain_text("runaway loop")
    assert_not_reloaded(page)
    assert_not_reloaded(list_page)
    assert Run.objects.get(pk=run.pk).cancel_note == "runaway loop"


def test_without_cancel_permission_no_abort_and_a_forged_post_is_403(page, live_server_url, fleet):
    make_user("watcher", "view_run")
    run = new_running_run(fleet, title="look, don't touch")
    log_in(page, live_server_url, "watcher")
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    expect(page.get_by_test_id("run-status")).to_have_text("running")
    expect(page.get_by_test_id("abort-button")).to_have_count(0)
    expect(page.locator("#run-actions")).to_contain_text("Read-only")
    statuses = page.evaluate(
        """async (url) => {
            const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken'];
            const post = (headers) => fetch(url, {method: 'POST', headers: {'X-CSRFToken': token, ...headers}});
            return [(await post({'HX-Request': 'true'})).status, (await post({})).status];
        }""",
        f"/runs/{run.id}/cancel",
    )
    assert statuses == [403, 403]
    run.refresh_from_db()
    assert run.cancel_requested_at is None and run.status == "running"


def test_script_and_img_in_title_and_stream_render_as_inert_text(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    log_in(page, live_server_url, "op")
    wait_live(page)
    run = new_running_run(fleet, title=EVIL)  # arrives live, through the socket
    row = page.locator(f'[data-run-id="{run.id}"]')
    expect(row).to_contain_text("<script>window.__pwned=1</script>")
    assert row.locator("img, script").count() == 0

    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    expect(page.locator("h1")).to_have_text(EVIL)
    fleet.run(stream(run.id, 0, ["<scr", "ipt>window.__pwned=3</script>", '<img src=x onerror="window.__pwned=4">']))
    text = page.get_by_test_id("inflight-text")
    expect(text).to_have_text('<script>window.__pwned=3</script><img src=x onerror="window.__pwned=4">')
    assert text.locator("img, script").count() == 0
    assert page.locator("main img").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_a_socket_without_a_session_is_refused(browser, live_server_url, fleet, page):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet)
    opener = """(url) => new Promise((resolve) => {
        const ws = new WebSocket(url);
        ws.onopen = () => setTimeout(() => { resolve('open'); ws.close(); }, 500);
        ws.onclose = (e) => resolve('closed ' + e.code);
    })"""
    ws_base = live_server_url.replace("http://", "ws://")
    anonymous = browser.new_context()
    try:
        stranger = anonymous.new_page()
        stranger.goto(live_server_url + "/accounts/login/")
        for path in ("/ws/runs/", f"/ws/runs/{run.id}/"):
            assert stranger.evaluate(opener, ws_base + path) == "closed 4403"
    finally:
        anonymous.close()
    # The same socket opens with a session: the refusal above is about the session.
    log_in(page, live_server_url, "op")
    assert page.evaluate(opener, ws_base + "/ws/runs/") == "open"


def test_a_hidden_tab_stops_listening_and_catches_up_when_shown(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    log_in(page, live_server_url, "op")
    wait_live(page)
    mark_page(page)
    page.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    expect(page.locator("#live-state")).to_have_text("paused (tab hidden)")
    page.wait_for_function("window.runwardenLive.socket.readyState === WebSocket.CLOSED")
    run = fleet.call(transitions.create_run, agent="scripted", title="made while hidden")
    page.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    wait_live(page)
    expect(page.locator(f'[data-run-id="{run.id}"]')).to_contain_text("made while hidden")
    assert_not_reloaded(page)


def test_a_reconnect_shows_no_gap_and_no_duplicate(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="flaky network")
    log_in(page, live_server_url, "op")
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    state = {"text": ""}
    channel = fleet.run(listen_on_control(run.id))
    fleet.start(answer_resyncs(run.id, channel, state))
    text = page.get_by_test_id("inflight-text")
    state["text"] = "alpha beta "
    fleet.run(stream(run.id, 0, ["alpha ", "beta "]))
    expect(text).to_have_text("alpha beta ")
    page.evaluate("window.runwardenLive.wrapper.reconnect()")
    state["text"] = "alpha beta gamma "
    fleet.run(stream(run.id, 0, ["gamma "], start=11))  # maybe nobody hears this one
    wait_live(page)
    expect(text).to_have_text("alpha beta gamma ")
    state["text"] = "alpha beta gamma delta"
    fleet.run(stream(run.id, 0, ["delta"], start=17))
    expect(text).to_have_text("alpha beta gamma delta")


def test_screenshot_of_a_busy_dashboard(page, live_server_url, fleet, screenshot_path):
    make_user("op", "view_run", "cancel_run")
    T = transitions

    def settled(title, status, reason, agent="researcher", **kwargs):
        run = new_running_run(fleet, title=title, agent=agent)
        fleet.call(T.commit_step, run.id, worker="w-test", index=0, kind="message", text="…",
                   tokens_in=1800, tokens_out=420, cost="0.0123")
        fleet.call(T.settle, run.id, status=status, reason=reason, worker="w-test", **kwargs)
        return run

    settled("Summarise incident #4411 postmortem", "completed", "completed")
    settled("Refactor billing module (budget 50k tokens)", "completed", "budget_exhausted", agent="coder",
            truncated=True)
    settled("Crawl vendor docs for rate limits", "failed", "provider_failed", agent="crawler")
    settled("Nightly dependency audit", "failed", "worker_lost", agent="auditor")
    cancelled = new_running_run(fleet, title="Translate release notes (wrong locale)", agent="translator")
    fleet.call(T.request_cancel, cancelled.id, by="alice", note="wrong locale")
    fleet.call(T.settle, cancelled.id, status="cancelled", reason="cancelled", worker="w-test")
    stuck = new_running_run(fleet, title="Reconcile ledger exports", agent="auditor")
    Run.objects.filter(pk=stuck.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=4))
    approval = new_running_run(fleet, title="Rotate staging credentials", agent="ops")
    fleet.call(T.suspend, approval.id, worker="w-test", status="waiting_for_approval", request={"tool": "rotate_keys"})
    cancelling = new_running_run(fleet, title="Generate 10k synthetic test cases", agent="coder")
    fleet.call(T.request_cancel, cancelling.id, by="bob", note="too expensive")
    busy = new_running_run(fleet, title="Answer support ticket #9921", agent="support")
    fleet.call(T.commit_step, busy.id, worker="w-test", index=0, kind="tool_calls", text="Looking up the order",
               tool_calls=[{"id": "c1", "name": "orders.lookup", "args": {"id": 9921}, "result": {"status": "shipped"}}],
               tokens_in=2400, tokens_out=310, cost="0.0210")
    fleet.call(T.create_run, agent="researcher", title="Compare vector DBs for the search revamp")
    log_in(page, live_server_url, "op")
    wait_live(page)
    expect(page.locator('[data-testid="run-row"]')).to_have_count(10)
    page.screenshot(path=str(screenshot_path))
    assert screenshot_path.stat().st_size > 10_000


def test_filters_decide_which_new_runs_join_the_list(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    log_in(page, live_server_url, "op")
    wait_live(page)
    page.get_by_label("Search").fill("needle")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"q=needle"))
    wait_live(page)
    hay = fleet.call(transitions.create_run, agent="scripted", title="just hay")
    needle = fleet.call(transitions.create_run, agent="scripted", title="a needle, at last")
    expect(page.locator(f'[data-run-id="{needle.id}"]')).to_be_visible()
    # Frames arrive in order on one socket: the earlier run was seen and left out.
    assert page.locator(f'[data-run-id="{hay.id}"]').count() == 0
