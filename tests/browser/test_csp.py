"""The pages pass their Content-Security-Policy in a real Chromium: no inline script or
style, the WebSocket allowed by connect-src 'self', and an abort still works."""

import re
import threading

import pytest
from playwright.sync_api import expect

from tests.browser.test_dashboard import honour_cancel, listen_on_control, log_in, make_user, new_running_run, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Registered before any page script runs (and not itself subject to the policy).
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


@pytest.fixture
def violations(context):
    """Every CSP violation any page of the context reports: events and console lines."""
    seen = []
    context.add_init_script(RECORD_VIOLATIONS)

    def on_console(message):
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            seen.append(f"console: {message.text}")

    context.on("page", lambda page: page.on("console", on_console))
    yield seen


def events(page):
    return page.evaluate("window.__csp || []")


def test_pages_pass_the_policy_live_and_abort_included(page, context, live_server_url, fleet, violations):
    page.on("console", lambda m: violations.append(f"console: {m.text}") if "Content Security Policy" in m.text else None)
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="under a strict policy")

    response = page.goto(live_server_url + "/accounts/login/")
    policy = response.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "'unsafe-inline'" not in policy
    assert events(page) == []

    log_in(page, live_server_url, "op")
    wait_live(page)  # htmx, its ws extension and live.js ran; the socket opened under connect-src
    expect(page.locator(f'[data-run-id="{run.id}"]')).to_contain_text("under a strict policy")
    assert events(page) == []

    run = new_running_run(fleet, title="to abort")  # fresh: its heartbeat is not stale yet
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    channel = fleet.run(listen_on_control(run.id))
    go = threading.Event()
    worker = fleet.start(honour_cancel(run.id, channel, go))
    page.get_by_test_id("abort-button").click()
    expect(page.locator("#abort-dialog")).to_be_visible()
    page.get_by_test_id("confirm-abort").click()
    expect(page.locator("#run-header")).to_contain_text("Aborting…")
    go.set()
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    assert worker.result(10) == "settled"  # SettleOutcome.SETTLED
    # htmx would inject its indicator <style> (refused by style-src) unless configured off.
    assert page.evaluate("document.querySelectorAll('style').length") == 0
    assert events(page) == []
    assert violations == []


def test_the_policy_is_enforced_not_just_sent(page, live_server_url, fleet, violations):
    """The test above can fail: an inline script on one of our pages is refused and reported."""
    make_user("op", "view_run")
    log_in(page, live_server_url, "op")
    page.evaluate("""() => { const s = document.createElement('script');
                             s.textContent = 'window.__inline = 1'; document.head.appendChild(s); }""")
    expect(page.locator("body")).to_be_visible()
    page.wait_for_function("window.__csp.length > 0")
    assert page.evaluate("window.__inline") is None
    assert any(v.startswith("script-src") for v in events(page))


def test_api_docs_render_under_the_policy(page, live_server_url, fleet, violations):
    page.goto(live_server_url + "/api/v1/docs")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    expect(page.locator(".swagger-ui")).to_contain_text(re.compile("runs", re.I))
    assert events(page) == [], events(page)
