"""The run page's budget bars in Chromium: a bar moves as a step commits, turns amber
near its limit, and says so in words."""

import pytest
from playwright.sync_api import expect

from runs import transitions
from tests.browser.test_dashboard import assert_not_reloaded, log_in, make_user, mark_page, new_running_run, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_budget_bar_moves_as_a_step_commits(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="spending", token_budget=1000)
    log_in(page, live_server_url, "op")
    page.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(page)
    mark_page(page)
    bar = page.get_by_role("progressbar", name="tokens budget")
    expect(bar).to_have_attribute("aria-valuenow", "0")
    expect(page.get_by_test_id("budget-tokens")).to_contain_text("0 / 1,000 tokens · 0 %")

    assert fleet.call(transitions.commit_step, run.id, worker="w-test", index=0, kind="message", text="hi",
                      tokens_in=300, tokens_out=120)
    expect(bar).to_have_attribute("aria-valuenow", "420")
    expect(page.get_by_test_id("budget-tokens")).to_contain_text("420 / 1,000 tokens · 42 %")

    assert fleet.call(transitions.commit_step, run.id, worker="w-test", index=1, kind="message", text="more",
                      tokens_in=400)
    expect(page.get_by_test_id("budget-tokens")).to_have_attribute("data-state", "near")
    expect(page.get_by_test_id("budget-tokens")).to_contain_text("82 % near the limit")
    assert_not_reloaded(page)
