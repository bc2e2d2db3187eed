"""Pages on a phone (390 px) and in another time zone, in a real Chromium."""

import re
from datetime import UTC, datetime

import pytest
from playwright.sync_api import expect

from runs import transitions
from runs.models import Run
from tests.browser.test_dashboard import log_in, make_user, new_running_run, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


SCROLLERS = """() => Array.from(document.querySelectorAll("main *")).filter(el => {
  const x = getComputedStyle(el).overflowX;
  return (x === "auto" || x === "scroll") && el.scrollWidth > el.clientWidth + 1;
}).map(el => el.className || el.tagName)"""


def no_sideways_scroll(page):
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"the page is {widths[0]}px wide on a {widths[1]}px screen"
    assert page.evaluate(SCROLLERS) == [], "a table or box scrolls sideways"


def in_view(page, selector):
    box = page.locator(selector).bounding_box()
    width = page.evaluate("window.innerWidth")
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= width, f"{selector} is cut off: {box}"
    clipped = page.eval_on_selector(selector, "el => el.scrollWidth > el.clientWidth || el.getClientRects().length > 1")
    assert not clipped, f"{selector} is squeezed: its text does not fit"


@pytest.fixture
def phone(browser, live_server_url):
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    yield context.new_page()
    context.close()


def test_every_page_fits_a_390px_screen_with_the_live_badge_in_view(phone, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="a rather long title for a run that someone named verbosely " * 2)
    lost = new_running_run(fleet, title="lost")
    fleet.call(lambda: Run.objects.filter(pk=lost.id).update(heartbeat_at=datetime(2026, 1, 1, tzinfo=UTC)))
    fleet.call(transitions.request_cancel, run.id, by="op", note="an audit entry")
    log_in(phone, live_server_url, "op")
    wait_live(phone)
    no_sideways_scroll(phone)
    in_view(phone, "#live-state")
    phone.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(phone)
    no_sideways_scroll(phone)
    in_view(phone, "#live-state")
    for path in ("/triage/", "/audit/", "/overview/", "/overview/?window=7d"):
        phone.goto(live_server_url + path)
        expect(phone.locator("h1")).to_be_visible()
        no_sideways_scroll(phone)


@pytest.fixture
def new_york(browser, live_server_url):
    context = browser.new_context(timezone_id="America/New_York", locale="en-US", viewport={"width": 1360, "height": 820})
    yield context.new_page()
    context.close()


def test_times_are_local_with_zone_and_date_and_utc_on_hover(new_york, live_server_url, fleet):
    make_user("op", "view_run", "cancel_run")
    run = new_running_run(fleet, title="from January")
    at = datetime(2026, 1, 15, 5, 51, 31, tzinfo=UTC)  # 00:51:31 in New York (EST)
    fleet.call(lambda: Run.objects.filter(pk=run.id).update(created_at=at))
    log_in(new_york, live_server_url, "op")
    wait_live(new_york)
    age = new_york.locator(f"#run-{run.id} .age time")
    expect(age).to_have_attribute("title", "2026-01-15 05:51:31 UTC")
    new_york.goto(f"{live_server_url}/runs/{run.id}/")
    wait_live(new_york)
    created = new_york.locator("dt:text-is('created') + dd time")
    expect(created).to_have_text(re.compile(r"Jan 15, 2026.*00:51:31 EST"))
    expect(created).to_have_attribute("title", "2026-01-15 05:51:31 UTC")
    # Today's instants are shown without a date, still with their zone.
    started = new_york.locator("dt:text-is('started') + dd time")
    expect(started).to_have_text(re.compile(r"^\d\d:\d\d:\d\d E[SD]T$"))
    expect(new_york.locator("#timeline time").first).to_have_text(re.compile(r"\d\d:\d\d:\d\d E[SD]T"))
    new_york.goto(f"{live_server_url}/audit/")
    fleet.call(transitions.request_cancel, run.id, by="op")
    new_york.reload()
    expect(new_york.locator("[data-testid=audit] time").first).to_have_text(re.compile(r"\d\d:\d\d:\d\d E[SD]T"))
