"""A live page whose socket is refused or ended says why, offers the way back, and
does not retry what retrying cannot fix."""

import re

import pytest
from playwright.sync_api import expect

from runs.models import Run
from tests.browser.test_dashboard import log_in, make_user, new_running_run, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# htmx retries a dropped socket within about a second (full jitter, 1 s cap for the
# first retry); waiting a few times that shows that none is made. An absence cannot be
# awaited as an event.
NO_RETRY_WINDOW_MS = 3000


def count_sockets(page):
    opened = []
    page.on("websocket", lambda ws: opened.append(ws.url))
    return opened


def test_logging_out_elsewhere_closes_the_socket_and_the_page_says_log_in_again(page, context, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="watched until logout")
    log_in(page, live_server_url, "op")
    opened = count_sockets(page)
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)

    other = context.new_page()  # another tab of the same browser: the same session
    other.goto(live_server_url + "/")
    other.get_by_role("button", name="Log out").click()
    expect(other).to_have_url(re.compile(r"/accounts/login/|/$"))

    state = page.locator("#live-state")
    expect(state).to_contain_text("log in again")
    link = page.get_by_test_id("log-in-again")
    expect(link).to_have_attribute("href", f"/accounts/login/?next=%2Fruns%2F{run.id}%2F")
    assert page.evaluate("window.runwardenLive.lastClose") == 4403
    sockets = len(opened)
    page.wait_for_timeout(NO_RETRY_WINDOW_MS)
    assert len(opened) == sockets, "the page kept reconnecting after it was told to log in again"
    expect(state).to_contain_text("log in again")

    link.click()
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))


def test_a_run_that_is_gone_says_run_not_found_and_is_not_retried(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="about to vanish")
    log_in(page, live_server_url, "op")
    opened = count_sockets(page)
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    fleet.call(lambda: Run.objects.filter(pk=run.pk).delete())
    page.evaluate("window.runwardenLive.wrapper.reconnect()")
    expect(page.locator("#live-state")).to_have_text("run not found")
    assert page.evaluate("window.runwardenLive.lastClose") == 4404
    sockets = len(opened)
    page.wait_for_timeout(NO_RETRY_WINDOW_MS)
    assert len(opened) == sockets


# --- triage and audit refresh by polling -------------------------------------------------------


def test_triage_and_audit_update_by_themselves(page, live_server_url, fleet):
    from runs import transitions

    make_user("op", "view_run", "cancel_run")
    log_in(page, live_server_url, "op")
    page.goto(live_server_url + "/triage/")
    expect(page.get_by_test_id("refreshed")).to_be_visible()
    page.evaluate("window.__noReload = true")
    run = new_running_run(fleet, title="asks before it acts")
    assert fleet.call(transitions.suspend, run.id, worker="w-test", status="waiting_for_approval", request={"tool": "rm"})
    expect(page.get_by_test_id("triage-approval")).to_contain_text("asks before it acts")
    assert page.evaluate("window.__noReload") is True

    page.goto(live_server_url + "/audit/")
    page.evaluate("window.__noReload = true")
    fleet.call(transitions.request_cancel, run.id, by="alice", note="seen in triage")
    expect(page.get_by_test_id("audit")).to_contain_text("seen in triage")
    assert page.evaluate("window.__noReload") is True


# --- a channel-layer outage ---------------------------------------------------------------------


@pytest.fixture
def proxied_server(live_server_url, django_db_blocker):
    """A second daphne whose Redis is behind a TcpProxy (the shared Redis is never
    stopped: the proxy is cut instead). The test process keeps the real Redis, so what
    it publishes during a cut is lost to this server, as in an outage."""
    from tests.conftest import _layer_env, start_daphne
    from tests.faults import TcpProxy

    layer = _layer_env()
    proxy = TcpProxy(int(layer["REDIS_URL"].rsplit(":", 1)[1].split("/")[0])).start()
    with django_db_blocker.unblock():
        url, server = start_daphne({**layer, "REDIS_URL": proxy.url(layer["REDIS_URL"])})
    yield url, proxy
    server.terminate()
    server.wait(timeout=10)
    proxy.stop()


def test_after_a_layer_outage_the_page_says_stale_then_resyncs_from_the_database(page, fleet, proxied_server):
    from runs import transitions

    base, proxy = proxied_server
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="cancelled while the layer was away")
    log_in(page, base, "op")
    page.goto(f"{base}/runs/{run.id}/")
    wait_live(page)
    page.evaluate("window.__noReload = true")
    state = page.locator("#live-state")

    proxy.cut()
    expect(state).to_have_attribute("data-state", "stale")
    expect(state).to_contain_text("updates may be missing")
    assert fleet.call(transitions.retire, run.id, by="op")  # announced on a layer this server cannot hear
    expect(page.get_by_test_id("run-status")).to_have_text("running")

    proxy.restore()
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    # The server's Redis connections heal one failed command at a time, and htmx backs off
    # between attempts: on a loaded machine "live" can take longer than the usual wait.
    expect(state).to_have_text("live", timeout=60_000)
    assert page.evaluate("window.__noReload") is True
