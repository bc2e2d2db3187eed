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


def test_abort_action_reports_each_outcome(operator, make_run, running_run, run_in):
    queued, live, done = make_run(), running_run(), run_in("completed")
    response = act(operator, "abort", [queued, live, done])
    message = [str(m) for m in response.context["messages"]][0]
    assert message == "1 requested, 1 settled, 1 had already ended"
    assert Run.objects.get(pk=queued.id).status == "cancelled"
    live_row = Run.objects.get(pk=live.id)
    assert live_row.is_cancelling and live_row.cancel_source == "admin"
    assert live_row.cancel_requested_by == "op"


def test_admin_offers_abort_and_retire_in_the_operators_words(operator, make_run):
    make_run()  # the changelist offers actions only when it lists something
    page = operator.get(CHANGELIST).content.decode()
    assert '<option value="abort">Abort</option>' in page and '<option value="retire">Retire</option>' in page
    assert "force cancel" not in page.lower() and "Request cancel" not in page


def test_retire_action_settles_live_runs(operator, running_run, run_in):
    live, done = running_run(), run_in("failed")
    response = act(operator, "retire", [live, done])
    assert [str(m) for m in response.context["messages"]][0] == "1 retired, 1 had already ended"
    assert Run.objects.get(pk=live.id).status == "cancelled"
    assert RunEvent.objects.get(run=live, kind="retired").source == "admin"


def test_viewer_without_cancel_permission_cannot_act(viewer, running_run):
    run = running_run()
    page = viewer.get(CHANGELIST)
    assert page.status_code == 200 and b"Abort" not in page.content and b"Retire" not in page.content
    act(viewer, "abort", [run])
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


def test_alert_rules_are_edited_in_the_admin_and_validated_and_deliveries_only_read(client):
    from runs.alert_records import AlertDelivery, AlertRule
    from runs.alerts import outbox

    client.force_login(User.objects.create_superuser("root", password="pw"))
    add = reverse("admin:runs_alertrule_add")
    form = {"name": "slow", "on": "waiting_too_long", "agent": "", "url": "http://alertmanager:9093/hook",
            "secret": "s", "format": "json", "min_runs": 5, "enabled": "on"}
    response = client.post(add, form)
    assert response.status_code == 200 and "waiting_too_long needs a threshold" in response.content.decode()
    assert client.post(add, {**form, "url": "ftp://x/y", "threshold_s": 60}).status_code == 200
    assert client.post(add, {**form, "threshold_s": 60}).status_code == 302
    rule = AlertRule.objects.get(name="slow")
    assert rule.threshold_s == 60
    outbox.enqueue([rule], on=rule.on, run=None, key="k", data={})
    delivery = AlertDelivery.objects.get()
    assert client.get(reverse("admin:runs_alertdelivery_changelist")).status_code == 200
    assert client.get(reverse("admin:runs_alertdelivery_add")).status_code == 403
    page = client.get(reverse("admin:runs_alertdelivery_change", args=[delivery.pk])).content.decode()
    assert "Save" not in page.split('id="content-main"')[1]  # read-only: no save button
