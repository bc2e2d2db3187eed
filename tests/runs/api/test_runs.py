"""POST /runs, POST /runs/claim, GET /runs/{id}."""

from django.core.management import call_command

from runs import transitions
from runs.models import Run, RunEvent
from tests.runs.api.conftest import ApiClient, error_code


def test_create_queues_a_run_with_the_transitions_argument_names(agent):
    _, client = agent
    body = {"agent": "rusty", "title": "t", "input": {"prompt": "hi"}, "max_iterations": 3,
            "token_budget": 1000, "cost_budget": 1.5, "deadline": "2030-01-01T12:00:00+02:00"}
    response = client.post("/runs", body)
    assert response.status_code == 201
    run = Run.objects.get(pk=response.json()["id"])
    assert (run.status, run.agent, run.input, run.max_iterations, run.token_budget) == ("queued", "rusty", {"prompt": "hi"}, 3, 1000)
    assert str(run.cost_budget) == "1.500000" and run.deadline.isoformat() == "2030-01-01T10:00:00+00:00"
    assert RunEvent.objects.filter(run=run, kind="created").exists()


def test_create_with_claim_returns_a_run_held_by_the_key(agent):
    _, client = agent
    body = client.post("/runs", {"agent": "go", "claim": True}).json()
    assert (body["status"], body["worker"]) == ("running", "api:bot")
    assert transitions.heartbeat(body["id"], worker="api:bot").held


def test_create_with_bad_limits_is_a_422_and_creates_nothing(agent):
    _, client = agent
    for body in ({"agent": ""}, {"agent": "x", "max_iterations": 0}, {"agent": "x", "cost_budget": -1},
                 {"agent": "x", "deadline": "2030-01-01T00:00:00"}, {"agent": "x", "token_budget": 2**70},
                 {"agent": "x", "max_iteration": 3}, {"agent": " "}):
        response = client.post("/runs", body)
        assert response.status_code == 422, body
        assert error_code(response) == "invalid" or response.json()["error"]["fields"] == {}
    assert not Run.objects.exists()


def test_claim_takes_the_oldest_queued_run_of_the_given_agents(agent, make_run):
    old, _new, other = make_run(agent="php"), make_run(agent="php"), make_run(agent="ts")
    _, client = agent
    response = client.post("/runs/claim", {"agents": ["php"]})
    assert response.status_code == 200
    assert response.json()["id"] == str(old.id) and response.json()["worker"] == "api:bot"
    other.refresh_from_db()
    assert other.status == "queued"


def test_claim_with_nothing_queued_is_a_204(agent, make_run):
    make_run(agent="php")
    response = agent[1].post("/runs/claim", {"agents": ["rust"]})
    assert response.status_code == 204 and response.content == b""


def test_get_shows_status_totals_and_cancel(agent, held_run):
    run_id = held_run()
    transitions.request_cancel(run_id, by="alice", note="enough")
    body = agent[1].get(f"/runs/{run_id}").json()
    assert body["status"] == "running" and body["totals"]["steps"] == 0
    assert (body["cancel"]["by"], body["cancel"]["note"]) == ("alice", "enough")


def test_get_an_unknown_or_malformed_id_is_a_404(agent):
    for run_id in ("00000000-0000-0000-0000-000000000000", "nope", "%00", "1" * 300):
        response = agent[1].get(f"/runs/{run_id}")
        assert response.status_code == 404, run_id
        assert error_code(response) == "run_not_found"


def test_the_openapi_schema_and_its_docs_page_are_served(db):
    client = ApiClient()
    schema = client.get("/openapi.json").json()
    assert {"/api/v1/runs", "/api/v1/runs/claim", "/api/v1/runs/{run_id}/control"} <= set(schema["paths"])
    assert schema["components"]["securitySchemes"]["KeyAuth"]["scheme"] == "bearer"
    assert client.get("/docs").status_code == 200


def test_apikey_list_never_shows_a_key(db, capsys):
    call_command("runs", "apikey", "create", "lister", "--agents", "ext")
    key = capsys.readouterr().out.strip()
    call_command("runs", "apikey", "list")
    listing = capsys.readouterr().out
    assert "lister" in listing and key not in listing
