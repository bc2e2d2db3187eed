"""POST /runs/{id}/discard: the same `step_discarded` entry engine runs get, its spend
in the totals, validated, once per index."""

import pytest

from runs import transitions
from runs.models import ApiInflight, Run, RunEvent
from tests.runs.api.conftest import error_code

pytestmark = pytest.mark.django_db


def test_a_discard_after_a_cancel_is_on_the_timeline_and_in_the_totals(agent, held_run):
    _, client = agent
    run_id = held_run()
    client.post(f"/runs/{run_id}/events", {"events": [{"type": "delta", "step": 0, "offset": 0, "text": "Half"}]})
    transitions.request_cancel(run_id, by="alice", source="user")
    body = {"index": 0, "text": "Half", "tool_calls": ["search"], "tokens_in": 30, "tokens_out": 4, "cost": 0.01,
            "estimated": True}
    response = client.post(f"/runs/{run_id}/discard", body)
    assert response.status_code == 201 and response.json() == {"discarded": True, "index": 0}
    event = RunEvent.objects.get(run_id=run_id, kind="step_discarded")
    assert (event.data["text"], event.data["interrupted"], event.data["tool_calls"], event.data["estimated"]) == (
        "Half", True, ["search"], True)
    run = Run.objects.get(pk=run_id)
    assert (run.tokens_in, run.tokens_out, str(run.cost)) == (30, 4, "0.010000")
    assert not ApiInflight.objects.filter(run_id=run_id).exists()  # late viewers no longer get it
    again = client.post(f"/runs/{run_id}/discard", body)
    assert again.status_code == 409 and error_code(again) == "already_discarded"
    assert Run.objects.get(pk=run_id).tokens_in == 30
    assert client.post(f"/runs/{run_id}/settle", {"status": "cancelled", "reason": "cancelled"}).status_code == 200


def test_a_discard_is_for_the_step_in_flight(agent, held_run):
    _, client = agent
    run_id = held_run()
    client.post(f"/runs/{run_id}/steps", {"index": 0, "kind": "message", "text": "a"})
    response = client.post(f"/runs/{run_id}/discard", {"index": 0, "text": "a"})
    assert response.status_code == 409 and error_code(response) == "wrong_index"
    assert response.json()["error"]["fields"] == {"index": "expected 1"}


@pytest.mark.parametrize("body", [{"index": 0, "estimated": "yes"}, {"index": 0, "tool_calls": [{"name": "x"}]},
                                  {"index": 0, "reason": "bored"}, {"index": -1}, {"index": 0, "tokens_in": -5}])
def test_a_malformed_discard_is_a_422(agent, held_run, body):
    _, client = agent
    run_id = held_run()
    assert client.post(f"/runs/{run_id}/discard", body).status_code == 422


def test_another_keys_discard_changes_nothing(agent, other_agent, held_run):
    run_id = held_run()
    _, other = other_agent
    assert error_code(other.post(f"/runs/{run_id}/discard", {"index": 0, "tokens_in": 9})) == "not_your_run"
    assert Run.objects.get(pk=run_id).tokens_in == 0
