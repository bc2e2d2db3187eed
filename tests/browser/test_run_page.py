"""The run page, in Chromium: an action's answer stays and stays true, an ignored
abort is followed step by step, a discarded step shows what it said and cost."""

import pytest
from playwright.sync_api import expect

from runs import transitions
from runs.models import Run
from tests.browser.test_dashboard import assert_not_reloaded, log_in, make_user, mark_page, new_running_run, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def watch_oob_errors(page):
    page.evaluate("""() => {
        window.__oobErrors = [];
        document.body.addEventListener('htmx:oobErrorNoTarget', (e) => window.__oobErrors.push(String(e.detail.target)));
    }""")


def test_retires_answer_stays_beside_the_end_of_the_run(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="its worker is gone")
    fleet.call(lambda: Run.objects.filter(pk=run.pk).update(heartbeat_at=run.created_at.replace(year=2000)))
    log_in(page, live_server_url, "op")
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    mark_page(page)
    watch_oob_errors(page)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("retire-button").click()
    # The run ends at once, so the live "ended" frame and the answer race; both stay.
    expect(page.get_by_test_id("ended")).to_contain_text("The run has ended: cancelled")
    expect(page.get_by_test_id("outcome")).to_contain_text("its late settle will be ignored")
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    expect(page.get_by_test_id("retire-button")).to_have_count(0)
    assert page.evaluate("window.__oobErrors") == []
    assert_not_reloaded(page)


def test_an_ignored_abort_is_followed_step_by_step_and_retire_appears_live(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="deaf to aborts")
    log_in(page, live_server_url, "op")
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    mark_page(page)
    page.get_by_test_id("abort-button").click()
    page.get_by_test_id("confirm-abort").click()
    steps = page.get_by_test_id("escalation")
    expect(steps.locator('[data-step="asked"]')).to_contain_text("via dashboard")
    expect(page.get_by_test_id("abort-button")).to_have_text("Aborting…")
    expect(page.get_by_test_id("retire-button")).to_have_count(0)

    assert fleet.call(transitions.escalate_cancel, run.id)  # the watchdog, after the grace
    expect(steps.locator('[data-step="not-honoured"]')).to_contain_text("a hard stop was asked")
    expect(page.get_by_test_id("retire-button")).to_be_visible()
    expect(page.locator("#timeline")).to_contain_text("hard stop asked")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("retire-button").click()
    expect(steps.locator('[data-step="ended"]')).to_contain_text("Ended cancelled")
    expect(page.get_by_test_id("outcome").first).to_contain_text("Retired")
    expect(page.locator("#timeline")).to_contain_text("retired")
    assert_not_reloaded(page)


def test_a_discarded_step_shows_its_text_and_spend(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="interrupted mid-sentence")
    log_in(page, live_server_url, "op")
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    mark_page(page)
    assert fleet.call(transitions.record_discard, run.id, worker="w-test", index=0, text="I was about to",
                      tool_calls=["search"], tokens_in=120, tokens_out=30, cost="0.0042")
    step = page.locator("#steps").get_by_test_id("discarded-step")
    expect(step).to_contain_text("I was about to")
    expect(step).to_contain_text("search")
    expect(step.get_by_test_id("discarded-step-spend")).to_contain_text("120 / 30 tokens in/out, $0.0042")
    assert_not_reloaded(page)
    page.reload()
    expect(page.locator("#steps").get_by_test_id("discarded-step")).to_contain_text("I was about to")
