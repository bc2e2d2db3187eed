"""The audit says from where an operator acted: "<who> via <where>" and the client
address, the forwarded one only behind a trusted proxy (issue 12)."""

import ipaddress

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from runs.api.auth import create_key
from runs.models import RunEvent

pytestmark = pytest.mark.django_db
PROXY = [ipaddress.ip_network("127.0.0.1/32")]


@override_settings(RUNWARDEN_TRUSTED_PROXIES=PROXY)
def test_an_abort_behind_the_proxy_keeps_the_forwarded_address(op_client, running_run):
    run = running_run(title="watched")
    response = op_client.post(f"/runs/{run.id}/cancel", {"note": "enough"}, HTTP_HX_REQUEST="true",
                              REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.1, 203.0.113.7")
    assert response.status_code == 202
    assert RunEvent.objects.get(run=run, kind="cancel_requested").data["client"] == "203.0.113.7"
    page = op_client.get(reverse("dashboard:audit")).content.decode()
    assert "operator via dashboard" in page and "203.0.113.7" in page
    csv = b"".join(op_client.get(reverse("dashboard:audit_csv")).streaming_content).decode()
    assert ",dashboard,203.0.113.7,abort," in csv


def test_a_forwarded_header_from_an_untrusted_peer_is_not_believed(op_client, running_run):
    run = running_run()
    op_client.post(f"/runs/{run.id}/retire", REMOTE_ADDR="192.0.2.9", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert RunEvent.objects.get(run=run, kind="retired").data["client"] == "192.0.2.9"


@pytest.mark.parametrize("verb", ["abort", "retire"])
def test_the_api_keeps_the_client_address(running_run, verb):
    _, key = create_key("ops", "operator")
    run = running_run()
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}", REMOTE_ADDR="192.0.2.44")
    assert api.post(f"/api/v1/runs/{run.id}/{verb}", {}, content_type="application/json").status_code == 200
    event = RunEvent.objects.get(run=run, kind__in=["cancel_requested", "retired"])
    assert (event.source, event.data["client"]) == ("api", "192.0.2.44")


def test_the_admin_keeps_the_client_address(running_run):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("adm", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "cancel_run"]))
    client = Client(REMOTE_ADDR="192.0.2.50")
    client.force_login(user)
    run = running_run()
    client.post(reverse("admin:runs_run_changelist"), {"action": "abort", "_selected_action": [str(run.id)]})
    event = RunEvent.objects.get(run=run, kind="cancel_requested")
    assert (event.actor, event.source, event.data["client"]) == ("adm", "admin", "192.0.2.50")
