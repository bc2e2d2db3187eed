import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from dashboard import listing
from runs import transitions
from runs.models import Run, RunInput

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


def row_ids(response):
    return re.findall(r'data-testid="run-row" data-run-id="([0-9a-f-]+)"', response.content.decode())


# --- access -----------------------------------------------------------------------------


def test_pages_need_a_login(client, make_run):
    run = make_run()
    for url in ("/", f"/runs/{run.id}/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


def test_pages_need_view_permission(stranger, make_run):
    run = make_run()
    client = Client()
    client.force_login(stranger)
    assert client.get("/").status_code == 403
    assert client.get(f"/runs/{run.id}/").status_code == 403


def test_login_page_logs_in_and_lands_on_the_list(operator):
    client = Client()
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "operator", "password": "pw-operator"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_body_carries_the_csrf_token_for_htmx(op_client):
    html = op_client.get("/").content.decode()
    assert re.search(r"<body hx-headers='\{&quot;X-CSRFToken&quot;: &quot;\w+&quot;\}'|<body hx-headers='\{\"X-CSRFToken\": \"\w+\"\}'", html)
    assert "hx-ws" in html  # the ws extension, from django-htmx


# --- the list -----------------------------------------------------------------------------


def test_list_shows_runs_newest_first_with_status_reason_and_totals(op_client, make_run, running_run):
    old = make_run(title="older")
    new = running_run(title="newer")
    transitions.request_cancel(old.id, by="someone")
    html = op_client.get("/").content.decode()
    assert row_ids(op_client.get("/")) == [str(new.id), str(old.id)]
    assert 'data-testid="run-status">cancelled<' in html
    assert 'data-testid="run-status">running<' in html
    assert "ws-connect=\"/ws/runs/?" in html


def test_list_marks_a_cancelling_run(op_client, running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="op")
    html = op_client.get("/").content.decode()
    row = html[html.index(f'data-run-id="{run.id}"'):]
    assert "Aborting…" in row[: row.index("</div>")]


@pytest.mark.parametrize(
    "query, expected",
    [
        ("status=running", {"live"}),
        ("reason=provider_failed", {"failed"}),
        ("agent=other", {"other"}),
        ("q=NEEDLE", {"needle"}),
        ("cancelling=1", {"cancelling"}),
        ("retryable=1", {"failed"}),
        ("stuck=1", {"stuck"}),
    ],
)
def test_list_filters(op_client, make_run, running_run, query, expected):
    named = {}
    named["queued"] = make_run(title="queued")
    named["live"] = running_run(title="live")
    named["needle"] = make_run(title="has a needle in it")
    named["other"] = make_run(title="other agent", agent="other")
    named["failed"] = running_run(title="failed")
    transitions.settle(named["failed"].id, status="failed", reason="provider_failed", worker="w1")
    named["cancelling"] = running_run(title="cancelling")
    transitions.request_cancel(named["cancelling"].id, by="op")
    named["stuck"] = running_run(title="stuck")
    Run.objects.filter(pk=named["stuck"].pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    # Only the "live" run is running without a cancel or a stale heartbeat... except for
    # the status filter, which is about status alone.
    if query == "status=running":
        expected = {"live", "cancelling", "stuck"}
    ids = set(row_ids(op_client.get("/?" + query)))
    assert ids == {str(named[name].id) for name in expected}


def test_search_by_run_id(op_client, make_run):
    wanted, _other = make_run(title="a"), make_run(title="b")
    assert row_ids(op_client.get(f"/?q={wanted.id}")) == [str(wanted.id)]


def test_keyset_pagination_walks_every_run_once(op_client, make_run, monkeypatch):
    monkeypatch.setattr(listing, "PAGE_SIZE", 3)
    made = [make_run(title=f"run {i}") for i in range(7)]
    seen, url = [], "/"
    while url:
        response = op_client.get(url)
        seen += row_ids(response)
        match = re.search(r'href="\?(?:[^"]*&amp;)?before=([\w-]+)"', response.content.decode())
        url = f"/?before={match.group(1)}" if match else ""
    assert seen == [str(run.id) for run in reversed(made)]


def test_counts_per_status(op_client, make_run, running_run):
    make_run(), make_run(), running_run()
    html = op_client.get("/").content.decode()
    assert re.search(r"queued <b>2</b>", html)
    assert re.search(r"running <b>1</b>", html)
    assert re.search(r"all <b>3</b>", html)


def test_titles_are_escaped(op_client, make_run):
    run = make_run(title='<script>alert(1)</script><img src=x onerror="alert(2)">')
    for url in ("/", f"/runs/{run.id}/"):
        html = op_client.get(url).content.decode()
        assert "<script>alert(1)" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=" in html


# --- the detail page ----------------------------------------------------------------------


def test_detail_shows_steps_tool_results_timeline_and_inputs(op_client, running_run):
    run = running_run(title="detailed")
    transitions.commit_step(run.id, worker="w1", index=0, kind="message", text="first thoughts")
    transitions.commit_step(
        run.id, worker="w1", index=1, kind="tool_calls", text="calling",
        tool_calls=[{"id": "c1", "name": "search", "args": {"q": "x"}, "result": "found it"}],
    )
    transitions.queue_input(run.id, kind="message", payload={"text": "hello run"}, by="op")
    transitions.request_cancel(run.id, by="alice", note="too slow")
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    assert 'id="step-0"' in html and "first thoughts" in html
    assert "<code>search</code>" in html and "found it" in html
    assert "cancel requested" in html and "<b>alice</b>" in html and "too slow" in html
    assert "hello run" in html
    assert f'data-seq="{Run.objects.get(pk=run.pk).event_seq}"' in html


def test_detail_of_unknown_run_is_404(op_client):
    assert op_client.get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_buttons_follow_the_run_and_the_permission(op_client, watcher_client, running_run, make_run):
    run = running_run()
    assert 'data-testid="abort-button"' in op_client.get(f"/runs/{run.id}/").content.decode()
    watcher_html = watcher_client.get(f"/runs/{run.id}/").content.decode()
    assert 'data-testid="abort-button"' not in watcher_html and "Read-only" in watcher_html
    transitions.settle(run.id, status="failed", reason="worker_lost", worker="w1")
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    assert 'data-testid="abort-button"' not in html and 'data-testid="retry-button"' in html
    assert 'data-testid="retry-button"' not in watcher_client.get(f"/runs/{run.id}/").content.decode()


def test_retire_is_offered_for_a_stuck_run_only(op_client, running_run):
    run = running_run()
    assert 'data-testid="retire-button"' not in op_client.get(f"/runs/{run.id}/").content.decode()
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    assert 'data-testid="retire-button"' in html and "may be gone" in html


# --- POST /runs/<uuid>/cancel: every answer ---------------------------------------------------


def test_cancel_of_a_running_run_is_202_requested(op_client, running_run):
    run = running_run()
    response = op_client.post(f"/runs/{run.id}/cancel", {"note": "stop it"}, **HX)
    assert response.status_code == 202
    html = response.content.decode()
    assert "Abort requested" in html and "Aborting…" in html
    assert re.search(r'data-testid="abort-button"[^>]*disabled', html)
    run.refresh_from_db()
    assert run.status == "running" and run.is_cancelling
    assert (run.cancel_requested_by, run.cancel_source, run.cancel_note) == ("operator", "dashboard", "stop it")


def test_cancel_twice_is_202_already_requested(op_client, running_run):
    run = running_run()
    op_client.post(f"/runs/{run.id}/cancel", **HX)
    response = op_client.post(f"/runs/{run.id}/cancel", **HX)
    assert response.status_code == 202
    assert "already requested" in response.content.decode()


def test_cancel_of_a_queued_run_is_200_settled(op_client, make_run):
    run = make_run()
    response = op_client.post(f"/runs/{run.id}/cancel", **HX)
    assert response.status_code == 200
    assert "cancelled at once" in response.content.decode()
    run.refresh_from_db()
    assert run.status == "cancelled"


def test_cancel_of_an_ended_run_is_409(op_client, running_run):
    run = running_run()
    transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    response = op_client.post(f"/runs/{run.id}/cancel", **HX)
    assert response.status_code == 409
    assert "already ended" in response.content.decode()
    run.refresh_from_db()
    assert run.status == "completed" and run.cancel_requested_at is None


def test_cancel_of_an_unknown_run_is_404(op_client):
    response = op_client.post("/runs/00000000-0000-0000-0000-000000000000/cancel", **HX)
    assert response.status_code == 404
    assert "No such run" in response.content.decode()


def test_cancel_without_permission_is_403_and_changes_nothing(watcher_client, running_run):
    run = running_run()
    for headers in (HX, {}):
        response = watcher_client.post(f"/runs/{run.id}/cancel", **headers)
        assert response.status_code == 403
    run.refresh_from_db()
    assert run.cancel_requested_at is None


def test_cancel_anonymous_is_sent_to_login(client, running_run):
    run = running_run()
    response = client.post(f"/runs/{run.id}/cancel")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    run.refresh_from_db()
    assert run.cancel_requested_at is None


def test_cancel_needs_post_and_a_csrf_token(operator, running_run):
    run = running_run()
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.get(f"/runs/{run.id}/cancel").status_code == 405
    assert client.post(f"/runs/{run.id}/cancel", **HX).status_code == 403
    run.refresh_from_db()
    assert run.cancel_requested_at is None
    token = client.get(f"/runs/{run.id}/").cookies["csrftoken"].value
    assert client.post(f"/runs/{run.id}/cancel", HTTP_X_CSRFTOKEN=token, **HX).status_code == 202


def test_cancel_without_htmx_redirects_to_the_run_with_the_message(op_client, running_run):
    run = running_run()
    response = op_client.post(f"/runs/{run.id}/cancel", follow=True)
    assert response.redirect_chain == [(f"/runs/{run.id}/", 302)]
    assert "Abort requested" in response.content.decode()


# --- the other actions ---------------------------------------------------------------------


def test_retire_settles_cancelled_then_409(op_client, running_run):
    run = running_run()
    response = op_client.post(f"/runs/{run.id}/retire", {"note": "worker gone"}, **HX)
    assert response.status_code == 200 and "Retired" in response.content.decode()
    run.refresh_from_db()
    assert (run.status, run.termination_reason) == ("cancelled", "cancelled")
    assert op_client.post(f"/runs/{run.id}/retire", **HX).status_code == 409


def test_retry_queues_a_linked_run_once(op_client, running_run):
    run = running_run()
    transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1")
    response = op_client.post(f"/runs/{run.id}/retry", **HX)
    assert response.status_code == 201
    new = Run.objects.get(retry_of=run)
    assert response["HX-Redirect"] == f"/runs/{new.id}/"
    assert op_client.post(f"/runs/{run.id}/retry", **HX).status_code == 409


@pytest.mark.parametrize("decision, approved", [("approve", True), ("deny", False)])
def test_approve_or_deny_a_waiting_run(op_client, running_run, decision, approved):
    run = running_run()
    assert transitions.suspend(run.id, worker="w1", status="waiting_for_approval", request={"tool": "rm"})
    assert 'data-testid="approve-button"' in op_client.get(f"/runs/{run.id}/").content.decode()
    response = op_client.post(f"/runs/{run.id}/approve", {"decision": decision}, **HX)
    assert response.status_code == 200
    assert RunInput.objects.get(run=run).payload == {"approved": approved}
    # The second answer loses: resume is claimed once.
    assert op_client.post(f"/runs/{run.id}/approve", {"decision": decision}, **HX).status_code == 409


def test_a_released_wait_shows_its_ask_and_deadline_not_stuck_nor_its_resume_state(op_client, released_in):
    run = released_in()
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    assert 'data-testid="approve-button"' in html and run.wait_deadline.isoformat() in html
    assert "may I?" not in html  # the engine's resume state is not the operator's to read
    assert "stuck: no heartbeat" not in html and 'data-testid="retire-button"' not in html
    assert op_client.post(f"/runs/{run.id}/approve", {"decision": "approve"}, **HX).status_code == 200
    assert Run.objects.get(pk=run.id).status == "queued"  # for the next free worker


def test_send_input_to_a_waiting_run(op_client, running_run):
    run = running_run()
    assert transitions.suspend(run.id, worker="w1", status="waiting_for_input", request={"prompt": "which one?"})
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    assert "which one?" in html and 'data-testid="send-input-button"' in html
    assert op_client.post(f"/runs/{run.id}/input", {"text": ""}, **HX).status_code == 400
    assert op_client.post(f"/runs/{run.id}/input", {"text": "the blue one"}, **HX).status_code == 200
    assert RunInput.objects.get(run=run).payload == {"text": "the blue one"}
    assert op_client.post(f"/runs/{run.id}/input", {"text": "again"}, **HX).status_code == 409


@pytest.mark.parametrize("action", ["retire", "retry", "approve", "input"])
def test_other_actions_are_403_without_permission(watcher_client, running_run, action):
    run = running_run()
    assert watcher_client.post(f"/runs/{run.id}/{action}", **HX).status_code == 403


def test_bulk_abort_reports_what_it_did(op_client, make_run, running_run, watcher_client):
    queued, live, done = make_run(), running_run(), running_run()
    transitions.settle(done.id, status="completed", reason="completed", worker="w1")
    ids = [str(queued.id), str(live.id), str(done.id)]
    assert watcher_client.post("/runs/bulk", {"action": "cancel", "run": ids}).status_code == 403
    response = op_client.post("/runs/bulk", {"action": "cancel", "run": ids, "next": "/?status=running"}, follow=True)
    assert response.redirect_chain[-1][0] == "/?status=running"
    assert "Abort of 3 runs: 1 had already ended, 1 requested, 1 settled." in response.content.decode()
    assert Run.objects.get(pk=queued.pk).status == "cancelled"
    assert Run.objects.get(pk=live.pk).is_cancelling


def test_retire_is_offered_when_a_cancel_is_not_honoured(op_client, running_run, settings):
    settings.RUNWARDEN_CANCEL_GRACE_S = 30
    run = running_run()
    transitions.request_cancel(run.id, by="op")
    assert 'data-testid="retire-button"' not in op_client.get(f"/runs/{run.id}/").content.decode()
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now() - timedelta(minutes=1))
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    assert 'data-testid="retire-button"' in html and "not been honoured" in html


def test_filtering_from_the_page_gets_just_the_list_partial(op_client, make_run):
    wanted, _other = make_run(title="wanted"), make_run(title="other")
    response = op_client.get("/?q=wanted", **HX)
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="live"') and "<body" not in html
    assert row_ids(response) == [str(wanted.id)]
    assert 'ws-connect="/ws/runs/?q=wanted&amp;page=1' in html


def test_list_catch_up_resends_what_changed_or_the_first_page_after_a_long_gap(make_run, monkeypatch):
    older = make_run()
    cursor = listing.last_event_id()
    newer = make_run()
    monkeypatch.setattr(listing, "CATCH_UP_MARGIN", 0)
    assert set(listing.changed_since(cursor, listing.Filters(), True)) == {newer.id}
    monkeypatch.setattr(listing, "CATCH_UP_WINDOW", 0)  # "long gone": refresh the first page
    assert set(listing.changed_since(cursor, listing.Filters(), True)) == {older.id, newer.id}
    assert listing.changed_since(cursor, listing.Filters(), False) == []


def test_heartbeat_cells_never_flag_a_released_wait_stuck_in_one_query(released_in, running_run, django_assert_num_queries):
    from dashboard import runview

    waits = [released_in() for _ in range(3)]
    lost = running_run()
    Run.objects.filter(pk=lost.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    runview._heartbeats["at"] = 0.0  # no memo from another test
    with django_assert_num_queries(1):  # `worker` is loaded with the rows, not per row
        cells = runview.heartbeat_cells()
    assert "stuck" in cells[str(lost.id)]
    assert all("stuck" not in cells[str(w.id)] for w in waits)
