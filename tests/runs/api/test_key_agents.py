"""Keys tied to agents: a key creates and claims only its agents' runs; the engine's
agents need explicit permission; another key's run stays out of reach."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.api.auth import create_key
from runs.models import ApiKey, Run
from tests.runs.api.conftest import ApiClient, error_code

pytestmark = pytest.mark.django_db


def client_for(name, agents, scope="agent"):
    _, token = create_key(name, scope, agents=agents)
    return ApiClient(token)


def test_a_key_creates_only_its_agents_runs():
    a = client_for("key-a", ["ext-A"])
    assert a.post("/runs", {"agent": "ext-A"}).status_code == 201
    response = a.post("/runs", {"agent": "ext-B"})
    assert response.status_code == 403 and error_code(response) == "agent_not_allowed"
    assert not Run.objects.filter(agent="ext-B").exists()


@pytest.mark.parametrize("engine_agent", ["openai", "scripted"])
def test_the_engines_agents_need_explicit_permission(engine_agent):
    wild = client_for("wild", ["*"])
    assert error_code(wild.post("/runs", {"agent": engine_agent})) == "agent_not_allowed"
    assert wild.post("/runs", {"agent": "anything-else"}).status_code == 201
    assert client_for("named", [engine_agent]).post("/runs", {"agent": engine_agent}).status_code == 201


def test_key_a_cannot_claim_read_or_settle_key_bs_run():
    a, b = client_for("key-a", ["ext-A"]), client_for("key-b", ["ext-B"])
    run_id = b.post("/runs", {"agent": "ext-B", "input": {"secret": 1}}).json()["id"]
    assert error_code(a.post("/runs/claim", {"agents": ["ext-B"]})) == "agent_not_allowed"
    assert error_code(a.get(f"/runs/{run_id}")) == "not_your_run"
    assert error_code(a.post(f"/runs/{run_id}/settle", {"status": "failed", "reason": "policy_denied"})) == "not_your_run"
    assert Run.objects.get(pk=run_id).status == "queued"
    assert b.post("/runs/claim", {"agents": ["ext-B"]}).json()["id"] == run_id


def test_operator_keys_run_any_agent():
    assert client_for("ops", [], "operator").post("/runs", {"agent": "openai"}).status_code == 201


def test_the_command_requires_and_changes_agent_lists(capsys):
    with pytest.raises(CommandError, match="--agents"):
        call_command("runs", "apikey", "create", "bare")
    call_command("runs", "apikey", "create", "listed", "--agents", "ext-a, ext-b")
    assert ApiKey.objects.get(name="listed").agents == ["ext-a", "ext-b"]
    call_command("runs", "apikey", "agents", "listed", "ext-c,scripted")
    assert ApiKey.objects.get(name="listed").agents == ["ext-c", "scripted"]
    call_command("runs", "apikey", "list")
    assert "runs ext-c,scripted" in capsys.readouterr().out
