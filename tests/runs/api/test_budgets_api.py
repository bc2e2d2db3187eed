"""The agent API and budgets: 429 for a capped agent's create and claim, and
PATCH /runs/{id}/budgets (operator keys) raising and lowering a run's limits."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from runs import transitions
from runs.models import AgentPolicy, Run, RunEvent
from tests.runs.api.conftest import error_code
from tests.runs.test_agent_caps import age, spent_run


@pytest.fixture(autouse=True)
def no_memo(settings):
    settings.RUNWARDEN_AGENT_CAPS_MEMO_S = 0


def patch(client, run_id, body, *, raw=None):
    data = raw if raw is not None else json.dumps(body)
    return client.client.patch(f"/api/v1/runs/{run_id}/budgets", data=data, content_type="application/json")


def capped(agent="ext", hours_old=1):
    AgentPolicy.objects.create(agent=agent, cost_cap_24h=Decimal("2"))
    age(spent_run(agent, cost="2"), hours_old)


def test_create_for_a_capped_agent_is_a_429_with_the_reason_and_retry_after(agent):
    capped(hours_old=20)  # the spend leaves the window in about 4 h
    response = agent[1].post("/runs", {"agent": "ext", "title": "more"})
    assert response.status_code == 429
    assert error_code(response) == "agent_budget_exhausted"
    body = response.json()
    assert "agent cost cap $2.00/24 h reached" in body["error"]["message"] and body["limit"] == "agent_cost_24h"
    assert 4 * 3600 - 120 <= int(response["Retry-After"]) <= 4 * 3600 + 120
    assert not Run.objects.filter(title="more").exists()


def test_create_and_claim_for_a_capped_agent_creates_nothing(agent):
    capped()
    response = agent[1].post("/runs", {"agent": "ext", "claim": True, "title": "more"})
    assert response.status_code == 429 and error_code(response) == "agent_budget_exhausted"
    assert not Run.objects.filter(title="more").exists()


def test_claim_of_only_capped_agents_is_a_429_and_the_run_stays_queued(agent, make_run):
    capped()
    queued = make_run(agent="ext")
    response = agent[1].post("/runs/claim", {"agents": ["ext"]})
    assert response.status_code == 429 and error_code(response) == "agent_budget_exhausted"
    assert Run.objects.get(pk=queued.pk).status == Run.Status.QUEUED


def test_claim_of_several_agents_skips_the_capped_ones(agent, make_run):
    capped()
    make_run(agent="ext")
    free = make_run(agent="other")
    response = agent[1].post("/runs/claim", {"agents": ["ext", "other"]})
    assert response.status_code == 200 and response.json()["id"] == str(free.pk)
    assert agent[1].post("/runs/claim", {"agents": ["ext", "other"]}).status_code == 204


def test_create_accepts_and_shows_a_tool_call_budget(agent):
    body = agent[1].post("/runs", {"agent": "ext", "tool_call_budget": 7}).json()
    assert body["tool_call_budget"] == 7 and Run.objects.get(pk=body["id"]).tool_call_budget == 7
    assert agent[1].post("/runs", {"agent": "ext", "tool_call_budget": 0}).status_code == 422


def test_patch_raises_limits_and_audits_each_change(operator, held_run):
    run_id = held_run(token_budget=100)
    deadline = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    response = patch(operator[1], run_id, {"token_budget": 500, "cost_budget": 1.25, "tool_call_budget": 9,
                                           "deadline": deadline.isoformat()})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["token_budget"], body["cost_budget"], body["tool_call_budget"]) == (500, 1.25, 9)
    event = RunEvent.objects.get(run_id=run_id, kind="budget_changed")
    assert (event.actor, event.source) == ("api:ops", "api")
    assert event.data["changes"] == {"token_budget": [100, 500], "cost_budget": [None, "1.25"],
                                     "tool_call_budget": [None, 9], "deadline": [None, deadline.isoformat()]}
    assert event.data["client"] == "127.0.0.1"


def test_patch_null_clears_a_limit_and_a_field_left_out_stays(operator, held_run):
    run_id = held_run(token_budget=100, cost_budget=3)
    assert patch(operator[1], run_id, {"token_budget": None}).status_code == 200
    run = Run.objects.get(pk=run_id)
    assert run.token_budget is None and run.cost_budget == Decimal(3)


def test_patch_with_the_same_values_writes_no_event(operator, held_run):
    run_id = held_run(token_budget=100)
    assert patch(operator[1], run_id, {"token_budget": 100}).status_code == 200
    assert not RunEvent.objects.filter(run_id=run_id, kind="budget_changed").exists()


def test_patch_bad_input_is_a_json_error_and_changes_nothing(operator, held_run):
    run_id = held_run(token_budget=100)
    client = operator[1]
    for body in ({}, {"token_budget": 0}, {"token_budget": "5"}, {"cost_budget": -1}, {"tokens": 5},
                 {"deadline": "2030-01-01T00:00:00"}, {"tool_call_budget": 2**40}):
        response = patch(client, run_id, body)
        assert response.status_code == 422, (body, response.content)
        assert error_code(response) == "invalid"
    past = patch(client, run_id, {"deadline": (timezone.now() - timedelta(minutes=1)).isoformat()})
    assert past.status_code == 400 and error_code(past) == "invalid_budget"
    assert "future" in past.json()["error"]["message"]
    malformed = patch(client, run_id, None, raw=b"{not json")
    assert malformed.status_code == 400 and error_code(malformed) == "malformed_body"
    assert Run.objects.get(pk=run_id).token_budget == 100
    assert not RunEvent.objects.filter(run_id=run_id, kind="budget_changed").exists()


def test_patch_of_an_ended_run_is_a_409_and_of_no_run_a_404(operator, make_run):
    run = make_run(agent="ext")
    transitions.request_cancel(run.pk, by="alice")  # queued: cancelled at once
    response = patch(operator[1], run.pk, {"token_budget": 5})
    assert response.status_code == 409 and error_code(response) == "run_ended"
    missing = patch(operator[1], "00000000-0000-0000-0000-000000000000", {"token_budget": 5})
    assert missing.status_code == 404


def test_patch_needs_an_operator_key(agent, held_run):
    run_id = held_run(token_budget=100)
    response = patch(agent[1], run_id, {"token_budget": 10**6})
    assert response.status_code == 403 and error_code(response) == "operator_only"
    assert Run.objects.get(pk=run_id).token_budget == 100


def test_the_openapi_schema_documents_the_budgets_patch(operator):
    schema = operator[1].get("/openapi.json").json()
    operation = schema["paths"]["/api/v1/runs/{run_id}/budgets"]["patch"]
    assert {"200", "400", "404", "409", "422"} <= set(operation["responses"])
    assert "429" in schema["paths"]["/api/v1/runs"]["post"]["responses"]


def test_an_api_agent_stopped_by_a_lowered_budget_ends_completed_budget_exhausted(agent, operator, held_run):
    """Lowered below what was spent: the agent hears the stop on its heartbeat, settles
    as it says, and the run ends completed / budget_exhausted, truncated."""
    run_id = held_run(token_budget=10_000)
    _, client = agent
    step = {"index": 0, "kind": "message", "text": "spent", "tokens_in": 400, "tokens_out": 100, "cost": 0.01}
    assert client.post(f"/runs/{run_id}/steps", step).status_code == 201
    assert patch(operator[1], run_id, {"token_budget": 300}).status_code == 200
    beat = client.post(f"/runs/{run_id}/heartbeat").json()
    assert (beat["cancel_requested"], beat["stop_reason"]) == (True, "budget_exhausted")
    settled = client.post(f"/runs/{run_id}/settle", {"status": "completed", "reason": "budget_exhausted",
                                                     "truncated": True})
    assert settled.status_code == 200, settled.content
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.termination_reason, run.truncated) == ("completed", "budget_exhausted", True)
    stop = RunEvent.objects.get(run=run, kind="stop_requested")
    assert stop.data["limit"] == "tokens"


def test_an_agent_reaching_its_24h_cap_mid_run_is_asked_to_stop(agent, held_run):
    AgentPolicy.objects.create(agent="ext", token_cap_24h=500)
    run_id = held_run()
    _, client = agent
    step = {"index": 0, "kind": "message", "text": "big", "tokens_in": 500}
    assert client.post(f"/runs/{run_id}/steps", step).status_code == 201
    beat = client.post(f"/runs/{run_id}/heartbeat").json()
    assert (beat["cancel_requested"], beat["stop_reason"]) == (True, "budget_exhausted")
    assert RunEvent.objects.get(run_id=run_id, kind="stop_requested").data["limit"] == "agent_tokens_24h"
    assert client.post("/runs", {"agent": "ext"}).status_code == 429
