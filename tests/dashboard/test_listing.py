"""The run list's questions: crafted cursors, the short id, times as the pages render them."""

import base64
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template
from django.utils import timezone

from dashboard import listing
from runs import transitions
from runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db


def crafted(raw):
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def row_ids(html):
    return re.findall(r'data-run-id="([0-9a-f-]{36})"', html)


CRAFTED = [
    "2099-01-01T00:00:00+16:00|00000000-0000-0000-0000-000000000001",  # PostgreSQL refuses the offset
    "0001-01-01T00:00:00+01:00|00000000-0000-0000-0000-000000000001",  # before year 1 in UTC
    "2026-01-01T00:00:00|00000000-0000-0000-0000-000000000001",  # no zone at all
    "not a date|nope",
]


@pytest.mark.parametrize("raw", CRAFTED)
def test_a_crafted_cursor_is_ignored_not_a_500(op_client, running_run, raw):
    run = running_run(title="the only run")
    response = op_client.get("/", {"before": crafted(raw)})
    assert response.status_code == 200
    assert row_ids(response.content.decode()) == [str(run.id)]  # read in UTC, or ignored: never a 500


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("raw", CRAFTED[:2])
def test_a_crafted_cursor_is_ignored_on_postgresql(postgres, op_client, running_run, raw):
    running_run()
    assert op_client.get("/", {"before": crafted(raw)}).status_code == 200


def test_a_cursor_in_another_zone_is_read_as_its_instant(make_run):
    runs = [make_run(title=f"r{i}") for i in range(3)]
    middle = Run.objects.get(pk=runs[1].id)
    shifted = middle.created_at.astimezone(timezone.get_fixed_timezone(-300)).isoformat()
    rows, _ = listing.page(listing.Filters(), before=crafted(f"{shifted}|{middle.pk}"))
    assert [r.pk for r in rows] == [runs[0].id]


def test_search_by_the_short_id_the_pages_show(op_client, make_run):
    wanted, other = make_run(title="wanted"), make_run(title="other")
    short = str(wanted.id)[:8]
    html = op_client.get("/", {"q": short}).content.decode()
    assert str(wanted.id) in row_ids(html) and str(other.id) not in row_ids(html)
    assert row_ids(op_client.get("/", {"q": short.upper()}).content.decode()) == [str(wanted.id)]
    # A hex word is a title search as well.
    titled = make_run(title=f"see {short} here")
    assert set(row_ids(op_client.get("/", {"q": short}).content.decode())) == {str(wanted.id), str(titled.id)}


def test_short_id_ranges_cover_exactly_the_prefix():
    low, high = listing.short_id_range("2954ABAA")
    assert str(low) == "2954abaa-0000-0000-0000-000000000000" and str(high) == "2954abaa-ffff-ffff-ffff-ffffffffffff"
    assert listing.short_id_range("run") is None and listing.short_id_range("abc") is None


def render(source, **context):
    return Template("{% load runwarden %}" + source).render(Context(context))


def test_instants_render_as_utc_with_date_zone_and_hover():
    at = datetime(2026, 12, 1, 5, 51, 31, 123456, tzinfo=UTC)
    html = render("{% when at %}", at=at)
    assert html == ('<time datetime="2026-12-01T05:51:31.123456+00:00" title="2026-12-01 05:51:31 UTC" data-at>'
                    "2026-12-01 05:51:31 UTC</time>")
    assert render("{% when at %}", at="2026-12-01T00:51:31-05:00") == html.replace(".123456", "")
    assert render("{% when at %}", at=None) == "—"


def test_ages_and_deadlines_are_humanised_with_the_instant_on_hover():
    now = timezone.now()
    age = render("{% age at %}", at=now - timedelta(minutes=3, seconds=4))
    assert re.fullmatch(r'<time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC" data-tick>3m 0[45]s</time>', age)
    deadline = render("{% deadline at %}", at=(now + timedelta(minutes=5, seconds=30)).isoformat())
    assert deadline.startswith("in 5m 2") and "data-at" in deadline and ".%f" not in deadline
    assert "+00:00<" not in deadline  # never the raw ISO text
    assert render("{% deadline at %}", at=now - timedelta(seconds=70)).startswith("passed 1m 10s ago")


def test_list_rows_carry_their_sort_key_in_the_lists_order(op_client, make_run):
    for i in range(3):
        make_run(title=f"r{i}")
    keys = re.findall(r'data-sort="([^"]+)"', op_client.get("/").content.decode())
    assert len(keys) == 3 and keys == sorted(keys, reverse=True)


def test_changed_since_bounds(db):
    ids = [transitions.create_run(agent="scripted", title=f"r{i}").id for i in range(5)]
    runs = {r.pk: r for r in Run.objects.all()}
    start = RunEvent.objects.order_by("pk").first().pk - 1
    oldest = listing.decode_cursor(listing.encode_cursor(runs[ids[1]]))
    newest = listing.decode_cursor(listing.encode_cursor(runs[ids[3]]))
    first = set(listing.changed_since(start, listing.Filters(), True, oldest=oldest, newest=newest))
    assert first == set(ids[1:])  # a first page takes new runs above its first row
    later = set(listing.changed_since(start, listing.Filters(), False, oldest=oldest, newest=newest))
    assert later == set(ids[1:4])
