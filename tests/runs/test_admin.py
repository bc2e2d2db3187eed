"""The admin shows runs read-only and acts only through the transitions."""

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db
CHANGELIST = reverse("admin:runs_run_changelist")


@pytest.fixture
def operator(client):
    user = User.objects.create_user("op", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "cancel_run"]))
    client.force_login(user)
    return client


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(user)
    return client


def act(client, action, runs):
    return client.post(
        CHANGELIST, {"action": action, "_selected_action": [str(r.id) for r in runs]}, follow=True
    )


def test_request_cancel_action_reports_each_outcome(operator, make_run, running_run, run_in):
    queued, live, done = make_run(), running_run(), run_in("completed")
    response = act(operator, "request_cancel", [queued, live, done])
    message = [str(m) for m in response.context["messages"]][0]
    assert message == "1 requested, 1 settled, 1 already terminal"
    assert Run.objects.get(pk=queued.id).status == "cancelled"
    live_row = Run.objects.get(pk=live.id)
    assert live_row.is_cancelling and live_row.cancel_source == "admin"
    assert live_row.cancel_requested_by == "op"


def test_retire_action_settles_live_runs(operator, running_run, run_in):
    live, done = running_run(), run_in("failed")
    response = act(operator, "retire", [live, done])
    assert [str(m) for m in response.context["messages"]][0] == "1 settled, 1 already terminal"
    assert Run.objects.get(pk=live.id).status == "cancelled"
    assert RunEvent.objects.get(run=live, kind="retired").source == "admin"


def test_viewer_without_cancel_permission_cannot_act(viewer, running_run):
    run = running_run()
    page = viewer.get(CHANGELIST)
    assert page.status_code == 200 and b"Request cancel" not in page.content
    act(viewer, "request_cancel", [run])
    assert not Run.objects.get(pk=run.id).is_cancelling


def test_run_page_is_read_only(operator, running_run):
    run = running_run()
    url = reverse("admin:runs_run_change", args=[run.id])
    assert operator.get(url).status_code == 200
    operator.post(url, {"status": "completed", "termination_reason": "completed"})
    assert Run.objects.get(pk=run.id).status == "running"


def test_changelist_filters(operator, make_run, run_in):
    make_run(agent="alpha")
    run_in("failed", agent="beta")
    page = operator.get(CHANGELIST, {"status__exact": "failed"})
    assert page.status_code == 200
    assert list(page.context["cl"].queryset.values_list("agent", flat=True)) == ["beta"]


def test_the_admin_edits_only_a_keys_agent_names(client):
    from runs.api.auth import create_key
    from runs.models import ApiKey

    record, _ = create_key("edited", agents=["ext-a"])
    client.force_login(User.objects.create_superuser("root", password="pw"))
    url = reverse("admin:runs_apikey_change", args=[record.pk])
    response = client.post(url, {"agents": '["ext-b", " ext-b", "scripted"]', "name": "renamed", "scope": "operator"})
    assert response.status_code == 302, response.content[:500]
    record = ApiKey.objects.get(pk=record.pk)
    assert (record.name, record.scope, record.agents) == ("edited", "agent", ["ext-b", "scripted"])
