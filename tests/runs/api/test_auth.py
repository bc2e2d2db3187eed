"""Keys: shown once, stored hashed, revocable; a key touches only its own runs."""

import pytest
from django.core.management import call_command

from runs import transitions
from runs.api.auth import hash_key
from runs.models import ApiKey, Run
from tests.runs.api.conftest import ApiClient, error_code

RUN_ENDPOINTS = [
    ("get", "{id}", None),
    ("post", "{id}/heartbeat", {}),
    ("post", "{id}/events", {"events": [{"type": "delta", "step": 0, "offset": 0, "text": "x"}]}),
    ("post", "{id}/steps", {"index": 0, "kind": "message", "text": "x"}),
    ("post", "{id}/settle", {"status": "completed", "reason": "completed"}),
    ("post", "{id}/suspend", {"status": "waiting_for_input"}),
    ("get", "{id}/control?wait=0", None),
]


def call(client, method, path, body):
    return client.get(path) if method == "get" else client.post(path, body)


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nope", "Basic dXNlcjpwYXNz", "Bearer rw_" + "x" * 43])
def test_a_request_without_a_valid_key_is_a_json_401(db, header, held_run):
    client = ApiClient()
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.client.post("/api/v1/runs", data="{}", content_type="application/json", **extra)
    assert response.status_code == 401
    assert error_code(response) == "unauthorized"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_apikey_create_prints_the_key_once_and_stores_only_its_hash(db, capsys):
    call_command("runs", "apikey", "create", "rusty", "--scope", "operator")
    key = capsys.readouterr().out.strip()
    record = ApiKey.objects.get(name="rusty")
    assert key.startswith("rw_") and record.key_hash == hash_key(key)
    assert key not in {record.key_hash, record.prefix} and record.scope == "operator"
    assert ApiClient(key).post("/runs", {"agent": "rust"}).status_code == 201


def test_a_revoked_key_is_refused(db, capsys):
    call_command("runs", "apikey", "create", "gone", "--agents", "ext")
    key = capsys.readouterr().out.strip()
    call_command("runs", "apikey", "revoke", "gone")
    assert ApiClient(key).post("/runs", {"agent": "go"}).status_code == 401


@pytest.mark.parametrize("method,path,body", RUN_ENDPOINTS)
def test_a_key_cannot_touch_another_agents_run(other_agent, held_run, method, path, body):
    run_id = held_run()
    _, intruder = other_agent
    before = Run.objects.values().get(pk=run_id)
    response = call(intruder, method, "/runs/" + path.format(id=run_id), body)
    assert response.status_code == 403
    assert error_code(response) == "not_your_run"
    assert Run.objects.values().get(pk=run_id) == before


@pytest.mark.parametrize("method,path,body", RUN_ENDPOINTS)
def test_a_key_cannot_touch_a_run_of_the_built_in_engine(agent, foreign_run, method, path, body):
    _, client = agent
    response = call(client, method, "/runs/" + path.format(id=foreign_run), body)
    assert response.status_code == 403
    assert Run.objects.get(pk=foreign_run).status == Run.Status.RUNNING


@pytest.mark.parametrize("verb", ["cancel", "retire"])
def test_an_agent_key_may_not_cancel_or_retire(agent, held_run, verb):
    run_id = held_run()
    _, client = agent
    response = client.post(f"/runs/{run_id}/{verb}", {"note": "mine"})
    assert response.status_code == 403
    assert error_code(response) == "operator_only"
    assert Run.objects.get(pk=run_id).cancel_requested_at is None


def test_the_creator_may_read_its_queued_run_but_others_may_not(agent, other_agent):
    _, client = agent
    run_id = client.post("/runs", {"agent": "ext"}).json()["id"]
    assert client.get(f"/runs/{run_id}").json()["status"] == "queued"
    assert other_agent[1].get(f"/runs/{run_id}").status_code == 403


def test_an_operator_key_reads_any_run(operator, foreign_run):
    assert operator[1].get(f"/runs/{foreign_run}").json()["worker"] == "engine-1"


def test_an_operator_cannot_settle_a_run_it_does_not_hold(operator, foreign_run):
    response = operator[1].post(f"/runs/{foreign_run}/settle", {"status": "completed", "reason": "completed"})
    assert response.status_code == 409
    assert error_code(response) == "not_held"
    assert Run.objects.get(pk=foreign_run).status == Run.Status.RUNNING


def test_a_key_rotated_under_the_same_name_keeps_its_runs(make_key, held_run):
    run_id = held_run()
    ApiKey.objects.filter(name="bot").update(revoked_at="2026-01-01T00:00:00Z")
    _, token = make_key("bot")
    assert ApiClient(token).post(f"/runs/{run_id}/heartbeat").json()["held"] is True
    assert transitions.heartbeat(run_id, worker="api:bot").held
