"""Triage, bulk preview/confirm, audit (and CSV), overview and /metrics."""

import csv
import io
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from runs import transitions
from runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_overview():
    """The overview memoises each window per process; every test starts without it."""
    from runs import overview

    overview._memo.clear()


def stale(run, seconds=600):
    Run.objects.filter(pk=run.id).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


@pytest.mark.parametrize("name", ["triage", "audit", "overview", "audit_csv"])
def test_pages_need_login_and_view_permission(name, stranger):
    url = reverse(f"dashboard:{name}")
    assert Client().get(url).status_code == 302  # to the login page
    client = Client()
    client.force_login(stranger)
    assert client.get(url).status_code == 403


def test_triage_shows_each_section_with_counts(op_client, running_run):
    lost = running_run(title="lost worker")
    stale(lost)
    running_run(title="healthy")
    page = op_client.get(reverse("dashboard:triage"))
    html = page.content.decode()
    assert page.status_code == 200
    stuck = html.split('data-testid="triage-stuck"')[1].split("</section>")[0]
    assert "lost worker" in stuck and "healthy" not in stuck
    assert '<span class="n" data-testid="count">1</span>' in stuck
    assert "Retire all 1" in stuck


def test_triage_counts_stop_at_the_cap(op_client, running_run, monkeypatch):
    from dashboard.views import ops

    monkeypatch.setattr(ops, "COUNT_CAP", 2)
    for i in range(3):
        stale(running_run(title=f"lost {i}"))
    stuck = op_client.get(reverse("dashboard:triage")).content.decode().split('data-testid="triage-stuck"')[1]
    assert '<span class="n" data-testid="count">2+</span>' in stuck.split("</section>")[0]


def test_watcher_sees_triage_without_bulk_controls(watcher_client, running_run):
    stale(running_run(title="lost"))
    html = watcher_client.get(reverse("dashboard:triage")).content.decode()
    assert "lost" in html and "Retire all" not in html


def test_bulk_preview_counts_then_confirm_retires_through_transitions(op_client, running_run):
    runs = [running_run(title=f"lost {i}") for i in range(3)]
    for run in runs:
        stale(run)
    url = reverse("dashboard:bulk_preview")
    preview = op_client.get(url, {"action": "retire", "section": "stuck"})
    assert preview.status_code == 200
    assert '<b data-testid="bulk-count">3</b>' in preview.content.decode()
    assert not Run.objects.filter(status="cancelled").exists()  # a preview changes nothing

    transitions.settle(runs[0].id, status="completed", reason="completed", worker="w1")  # ends meanwhile
    done = op_client.post(url, {"action": "retire", "frozen": frozen(preview), "note": "host died"})
    html = done.content.decode()
    assert done.status_code == 200 and "<b>2</b> retired" in html and "<b>1</b> had already ended" in html
    assert Run.objects.get(pk=runs[0].id).status == "completed"  # not overwritten
    retired = RunEvent.objects.filter(kind="retired", data__note="host died")
    assert retired.count() == 2 and {e.actor for e in retired} == {"operator"}


def frozen(preview):
    """The signed set a bulk preview froze (its confirmation form's hidden field)."""
    html = preview if isinstance(preview, str) else preview.content.decode()
    return re.search(r'name="frozen" value="([^"]+)"', html).group(1)


def test_bulk_confirms_exactly_the_previewed_set(op_client, running_run, make_run):
    runs = [running_run(agent="fleet", title=f"r{i}") for i in range(6)]
    url = reverse("dashboard:bulk_preview")
    preview = op_client.get(url, {"action": "cancel", "agent": "fleet"}).content.decode()
    assert '<b data-testid="bulk-count">6</b>' in preview and "Abort 6 runs" in preview
    late = running_run(agent="fleet", title="created after the preview")
    transitions.settle(runs[0].id, status="failed", reason="provider_failed", worker="w1")
    html = op_client.post(url, {"action": "cancel", "frozen": frozen(preview)}).content.decode()
    assert "the 6 runs you confirmed" in html
    assert "<b>5</b> requested" in html and "<b>1</b> had already ended" in html
    assert not Run.objects.get(pk=late.id).is_cancelling


def test_bulk_refuses_a_forged_or_missing_confirmation(op_client, running_run):
    run = running_run(agent="fleet")
    url = reverse("dashboard:bulk_preview")
    preview = op_client.get(url, {"action": "cancel", "agent": "fleet"}).content.decode()
    for data in ({"action": "cancel", "frozen": frozen(preview)[:-2] + "xx"},
                 {"action": "retire", "frozen": frozen(preview)},  # signed for another action
                 {"action": "cancel", "agent": "fleet"}):  # no preview at all
        response = op_client.post(url, data)
        assert response.status_code == 400 and "preview" in response.content.decode()
    assert not Run.objects.get(pk=run.id).is_cancelling


def test_bulk_by_list_filter_and_by_selection(op_client, running_run, db):
    a, b = running_run(agent="alpha"), running_run(agent="beta")
    url = reverse("dashboard:bulk_preview")
    html = op_client.get(url, {"action": "cancel", "agent": "alpha"}).content.decode()
    assert '<b data-testid="bulk-count">1</b>' in html
    op_client.post(url, {"action": "cancel", "frozen": frozen(html)})
    assert Run.objects.get(pk=a.id).is_cancelling and not Run.objects.get(pk=b.id).is_cancelling
    op_client.post(url, {"action": "cancel", "run": [str(b.id)]})
    assert Run.objects.get(pk=b.id).is_cancelling


def test_bulk_needs_cancel_permission(watcher_client, running_run):
    run = running_run()
    response = watcher_client.post(reverse("dashboard:bulk_preview"), {"action": "retire", "run": [str(run.id)]})
    assert response.status_code == 403
    assert Run.objects.get(pk=run.id).status == "running"


def test_bulk_unknown_action_redirects_without_change(op_client, running_run):
    run = running_run()
    response = op_client.post(reverse("dashboard:bulk_preview"), {"action": "explode", "run": [str(run.id)]})
    assert response.status_code == 302 and Run.objects.get(pk=run.id).status == "running"


def test_audit_lists_actions_filters_and_exports_csv(op_client, running_run):
    run = running_run(title="noisy")
    transitions.request_cancel(run.id, by="alice", source="cli", note="too chatty")
    other = running_run(title="quiet")
    transitions.retire(other.id, by="bob", note="gone")
    html = op_client.get(reverse("dashboard:audit"), {"source": "cli"}).content.decode()
    assert "too chatty" in html and "alice" in html and "gone" not in html
    csv = b"".join(op_client.get(reverse("dashboard:audit_csv")).streaming_content).decode()
    assert csv.splitlines()[0] == "at,actor,where,client,action,run_id,run_title,note"
    assert "alice,cli,,abort" in csv and "bob,dashboard,,retire" in csv


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_the_audit_export_quotes_every_cell_a_spreadsheet_would_run(op_client, running_run, start):
    run = running_run(title=f'{start}HYPERLINK("http://evil")')
    transitions.request_cancel(run.id, by="alice", note=f"{start}1+cmd")
    body = b"".join(op_client.get(reverse("dashboard:audit_csv")).streaming_content).decode()
    reader = csv.DictReader(io.StringIO(body, newline=""))
    (row,) = list(reader)
    assert reader.fieldnames == ["at", "actor", "where", "client", "action", "run_id", "run_title", "note"]
    assert (row["run_title"], row["note"]) == (f"'{start}HYPERLINK(\"http://evil\")", f"'{start}1+cmd")


def test_overview_renders_charts_with_numbers(op_client, running_run):
    run = running_run()
    transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1")
    html = op_client.get(reverse("dashboard:overview")).content.decode()
    assert html.count("<svg") == 5
    assert "provider_failed" in html
    assert '<rect class="s-failed"' in html  # the hour's stacked bar has a failed segment
    assert '<rect class="r-provider_failed"' in html  # and the reasons over time one


@pytest.mark.parametrize("window,buckets,label", [("1h", 12, "Last hour"), ("24h", 24, "Last 24 hours"),
                                                   ("7d", 28, "Last 7 days"), ("junk", 24, "Last 24 hours")])
def test_overview_windows(op_client, running_run, window, buckets, label):
    from runs import overview

    overview._memo.clear()
    run = running_run()
    transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1")
    html = op_client.get(reverse("dashboard:overview"), {"window": window}).content.decode()
    assert f"<h1>{label}</h1>" in html
    first_chart = html.split('<svg class="chart"')[1].split("</svg>")[0]
    assert len(overview.for_window(window).buckets) == buckets
    assert first_chart.count('<rect class="s-failed"') == 1
    labels = re.findall(r"<text [^>]*>([^<]+)</text>", first_chart)
    assert 0 < len(labels) <= 8  # never more labels than fit apart
    assert all("data-at-label" in t for t in re.findall(r"<text [^>]*>", first_chart))


def test_overview_reason_bars_have_labels_on_rows_of_their_own(op_client, running_run):
    for reason in ("provider_failed", "worker_lost", "approval_denied"):
        transitions.settle(running_run().id, status="failed", reason=reason, worker="w1")
    html = op_client.get(reverse("dashboard:overview"), {"window": "1h"}).content.decode()
    reasons = html.split("Ended runs by termination reason</title>")[1].split("</svg>")[0]
    ys = [float(y) for y in re.findall(r'<text x="0" y="([0-9.]+)"', reasons)]
    assert len(ys) == 3 and all(b - a >= 20 for a, b in zip(ys, ys[1:]))  # 12 px text, never overlapping


def test_the_two_waits_have_distinct_colours():
    from pathlib import Path

    css = (Path(__file__).resolve().parents[2] / "static/dashboard/ops.css").read_text()
    assert "rect.s-waiting_for_input { fill: var(--violet); }" in css
    assert "rect.s-waiting_for_approval { fill: var(--teal); }" in css


def test_metrics_needs_token_or_allowlisted_address(settings, running_run):
    running_run()
    settings.RUNWARDEN_METRICS_TOKEN = "s3cret"
    settings.RUNWARDEN_METRICS_ALLOW = []
    client = Client(REMOTE_ADDR="10.1.2.3")
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert ok.status_code == 200 and b'runwarden_runs{reason="",status="running"} 1.0' in ok.content


def test_metrics_from_allowlisted_address(settings):
    import ipaddress

    settings.RUNWARDEN_METRICS_TOKEN = ""
    settings.RUNWARDEN_METRICS_ALLOW = [ipaddress.ip_network("127.0.0.1")]
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="127.0.0.2").get("/metrics").status_code == 403


@pytest.mark.parametrize("header", [
    {"HTTP_X_FORWARDED_FOR": "203.0.113.7"},
    {"HTTP_FORWARDED": "for=203.0.113.7;proto=https"},
    {"HTTP_X_REAL_IP": "203.0.113.7"},
])
def test_metrics_through_a_same_host_proxy_needs_the_token(settings, db, header):
    """nginx on this machine connects from 127.0.0.1: the address says nothing about who
    asked, so a forwarded request needs the token even from an allowlisted address."""
    import ipaddress

    settings.RUNWARDEN_METRICS_TOKEN = "s3cret"
    settings.RUNWARDEN_METRICS_ALLOW = [ipaddress.ip_network("127.0.0.1")]
    client = Client(REMOTE_ADDR="127.0.0.1")
    assert client.get("/metrics", **header).status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret", **header).status_code == 200


def test_list_offers_bulk_by_filter_only_when_filtered(op_client, running_run):
    running_run(agent="alpha")
    assert "every run matching the filters" not in op_client.get("/").content.decode()
    html = op_client.get("/", {"agent": "alpha"}).content.decode()
    assert f'{reverse("dashboard:bulk_preview")}?action=retire&amp;agent=alpha' in html


@pytest.mark.parametrize("url,query", [
    ("dashboard:bulk_preview", {"action": "retire", "run": ["nope", "", "1 OR 1=1"]}),
    ("dashboard:bulk_preview", {"action": "cancel", "section": "../../etc"}),
    ("dashboard:bulk_preview", {"action": "retry", "status": "exploded", "before": "%%%"}),
    ("dashboard:audit", {"run": "not-a-uuid", "page": "-3", "source": "<script>", "kind": "x" * 5000}),
    ("dashboard:audit_csv", {"run": "zzz", "actor": "\x00"}),
    ("dashboard:overview", {"junk": "1"}),
    ("dashboard:list", {"q": "nul\x00byte", "agent": "\x00", "before": "\x00"}),
    ("dashboard:triage", {"section": "nope"}),
])
def test_hostile_queries_never_500_and_change_nothing(op_client, running_run, url, query):
    run = running_run()
    response = op_client.get(reverse(url), query)
    if response.streaming:
        b"".join(response.streaming_content)  # a streamed body fails while it streams, not before
    assert response.status_code in (200, 302, 400, 404)
    assert Run.objects.get(pk=run.id).status == "running" and not Run.objects.get(pk=run.id).is_cancelling


def test_nul_bytes_in_a_form_are_refused_before_any_change(op_client, running_run):
    run = running_run()
    response = op_client.post(reverse("dashboard:cancel", args=[run.id]), {"note": "stop\x00now"})
    assert response.status_code == 400
    assert not Run.objects.get(pk=run.id).is_cancelling


def test_triage_shows_flagged_runs_with_their_evidence(op_client, running_run):
    from runs import loops

    looping = running_run(title="looping")
    running_run(title="healthy")
    loops.flag(looping.id, loops.REPEATED_TOOL, {"tool": "search", "args": {"q": "x"}, "times": 3, "steps": [3, 4, 5]})
    html = op_client.get(reverse("dashboard:triage")).content.decode()
    flagged = html.split('data-testid="triage-flagged"')[1].split("</section>")[0]
    assert "looping" in flagged and "healthy" not in flagged
    assert "called search(q=&#x27;x&#x27;) 3 times in a row (steps 4–6)" in flagged
    assert "Cancel all 1" in flagged
