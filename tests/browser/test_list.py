"""The run list in a real Chromium: its order and page size under live updates, its
filters, the operator's selection and scroll, and the keyboard."""

import re

import pytest
from playwright.sync_api import expect

from runs import transitions
from runs.models import Run
from tests.browser.test_dashboard import log_in, make_user, new_running_run, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
RUNS = 120  # more than two pages of 50


def create_runs(n, prefix="run", agent="scripted"):
    return [transitions.create_run(agent=agent, title=f"{prefix} {i}").id for i in range(n)]


def rows(page):
    return page.locator("#run-rows > [data-testid=run-row]")


def sort_keys(page):
    return page.eval_on_selector_all("#run-rows > [data-testid=run-row]", "els => els.map(e => e.dataset.sort)")


def row_of(page, run_id):
    return page.locator(f"#run-{run_id}")


def top_of(page, run_id):
    """Where the row is in the viewport, read in one go (a row may be swapped meanwhile)."""
    return page.evaluate("id => document.getElementById('run-' + id).getBoundingClientRect().top", str(run_id))


def test_catch_up_keeps_newest_first_and_the_page_size(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    fleet.call(create_runs, RUNS)
    log_in(page, live_server_url, "op")
    wait_live(page)
    newest = fleet.call(transitions.create_run, agent="scripted", title="the newest")
    expect(row_of(page, newest.id)).to_be_visible()
    older = fleet.call(lambda: list(Run.objects.order_by("created_at").values_list("pk", flat=True)[:5]))
    fleet.call(lambda: [transitions.claim(run_id, worker="w1") for run_id in older])  # page 3 changes
    # The next update after those, so the assertions below see the page after them.
    marker = fleet.call(transitions.create_run, agent="scripted", title="after the old ones changed")
    expect(row_of(page, marker.id)).to_be_visible()
    expect(rows(page)).to_have_count(50)
    keys = sort_keys(page)
    assert keys == sorted(keys, reverse=True)
    assert rows(page).first.get_attribute("data-run-id") == str(marker.id)
    for run_id in older:
        expect(row_of(page, run_id)).to_have_count(0)
    # "older" starts after the last row shown, so the next page misses nothing.
    page.locator("a[data-older]").click()
    expect(rows(page)).to_have_count(50)
    second = sort_keys(page)
    assert second == sorted(second, reverse=True) and second[0] < keys[-1]


def test_a_filtered_list_drops_rows_that_stop_matching(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    leaving, staying = new_running_run(fleet, title="will fail"), new_running_run(fleet, title="keeps running")
    log_in(page, live_server_url, "op")
    page.goto(live_server_url + "/?status=running")
    wait_live(page)
    expect(rows(page)).to_have_count(2)
    fleet.call(transitions.settle, leaving.id, status="failed", reason="provider_failed", worker="w-test")
    fleet.call(transitions.create_run, agent="scripted", title="queued, not running")
    expect(row_of(page, leaving.id)).to_have_count(0)
    expect(rows(page)).to_have_count(1)
    expect(row_of(page, staying.id)).to_be_visible()
    page.goto(live_server_url + "/?q=keeps")
    wait_live(page)
    fleet.call(transitions.request_cancel, staying.id, by="op")
    expect(row_of(page, staying.id).get_by_test_id("cancelling")).to_be_visible()  # still matches: updated, kept


def test_live_updates_keep_the_selection_and_the_scroll_position(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    ids = fleet.call(create_runs, 60)
    log_in(page, live_server_url, "op")
    wait_live(page)
    chosen = ids[-10]  # tenth newest
    row_of(page, chosen).get_by_label("Select run").check()
    row_of(page, ids[-3]).click(position={"x": 400, "y": 5})  # the keyboard's selection, by a click on the row
    page.evaluate("window.scrollTo(0, 600)")
    reading_id = rows(page).nth(20).get_attribute("data-run-id")
    top = top_of(page, reading_id)
    fleet.call(transitions.claim, chosen, worker="w1")  # its row is re-rendered
    fleet.call(transitions.claim, ids[-3], worker="w1")
    newcomer = fleet.call(transitions.create_run, agent="scripted", title="pushes in at the top")
    expect(row_of(page, newcomer.id)).to_be_attached()
    expect(row_of(page, chosen).get_by_test_id("run-status")).to_have_text(re.compile("running", re.I))
    expect(row_of(page, ids[-3]).get_by_test_id("run-status")).to_have_text(re.compile("running", re.I))
    expect(row_of(page, chosen).get_by_label("Select run")).to_be_checked()
    expect(row_of(page, ids[-3])).to_have_class(re.compile(r"\bselected\b"))
    moved = top_of(page, reading_id) - top
    assert abs(moved) <= 2, f"the row being read moved by {moved}px"


def test_keyboard_search_move_abort_and_the_keys(page, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    ids = fleet.call(create_runs, 3)
    log_in(page, live_server_url, "op")
    wait_live(page)
    page.keyboard.press("/")
    search = page.get_by_label("Search")
    expect(search).to_be_focused()
    page.keyboard.type("jk a")  # typing in a field: no key does anything else
    expect(search).to_have_value("jk a")
    expect(page.locator("#run-rows > .selected")).to_have_count(0)
    search.blur()
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(page.locator("#run-rows > .selected")).to_have_attribute("data-run-id", str(ids[1]))
    page.keyboard.press("k")
    expect(page.locator("#run-rows > .selected")).to_have_attribute("data-run-id", str(ids[2]))
    page.keyboard.press("?")
    expect(page.locator("#keys")).to_be_visible()
    expect(page.locator("#keys")).to_contain_text("abort the selected run")
    page.keyboard.press("Escape")
    expect(page.locator("#keys")).to_be_hidden()
    page.keyboard.press("a")
    dialog = page.locator("#key-abort")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Abort this run?")
    expect(dialog).to_contain_text("run 2")
    dialog.get_by_role("button", name="Keep it running").click()
    expect(dialog).to_be_hidden()
    assert fleet.call(lambda: Run.objects.get(pk=ids[2]).status) == "queued"
    page.keyboard.press("a")
    dialog.get_by_test_id("confirm-abort").click()
    expect(page.locator(".flash")).to_contain_text("Abort of 1 run: 1 settled")
    assert fleet.call(lambda: Run.objects.get(pk=ids[2]).status) == "cancelled"
    assert fleet.call(lambda: Run.objects.get(pk=ids[1]).status) == "queued"


def test_a_watcher_has_no_abort_key(page, live_server_url, fleet):
    make_user("watch", "view_run")
    fleet.call(create_runs, 1)
    log_in(page, live_server_url, "watch")
    wait_live(page)
    page.keyboard.press("j")
    page.keyboard.press("a")
    expect(page.locator("#run-rows > .selected")).to_have_count(1)
    expect(page.locator("dialog[open]")).to_have_count(0)
