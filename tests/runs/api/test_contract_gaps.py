"""The contract's edges: JSON misses, strict booleans, steps of deltas, tool-call ids,
settle totals checked against the record."""

import pytest

from runs.models import Run
from tests.runs.api.conftest import error_code

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("method,path,status,code", [
    ("get", "/nowhere", 404, "not_found"),
    ("post", "/runs/x/y/z", 404, "not_found"),
    ("get", "/runs/claim", 405, "method_not_allowed"),
    ("get", "/runs/00000000-0000-0000-0000-000000000000/settle", 405, "method_not_allowed"),
])
def test_misses_under_the_api_are_json(agent, method, path, status, code):
    _, client = agent
    response = getattr(client, method)(path)
    assert response.status_code == status and response["Content-Type"] == "application/json"
    assert error_code(response) == code
    if status == 405:
        assert "POST" in response["Allow"]


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_claim_is_a_strict_boolean(agent, value):
    _, client = agent
    response = client.post("/runs", {"agent": "ext", "claim": value})
    assert response.status_code == 422 and "claim" in response.json()["error"]["fields"]
    assert not Run.objects.exists()


def delta(step, offset, text):
    return {"type": "delta", "step": step, "offset": offset, "text": text}


def test_deltas_for_a_committed_or_a_later_step_are_refused(agent, held_run):
    _, client = agent
    run_id = held_run()
    assert client.post(f"/runs/{run_id}/steps", {"index": 0, "kind": "message", "text": "a"}).status_code == 201
    committed = client.post(f"/runs/{run_id}/events", {"events": [delta(0, 0, "late")]})
    assert committed.status_code == 409 and error_code(committed) == "step_committed"
    later = client.post(f"/runs/{run_id}/events", {"events": [delta(1, 0, "ok"), delta(2, 0, "ahead")]})
    assert later.status_code == 422 and error_code(later) == "wrong_step"
    assert client.post(f"/runs/{run_id}/events", {"events": [delta(1, 0, "ok")]}).status_code == 200


def test_duplicate_tool_call_ids_in_a_step_are_refused(agent, held_run):
    _, client = agent
    run_id = held_run()
    call = {"id": "c1", "name": "search", "args": {}, "result": "r"}
    response = client.post(f"/runs/{run_id}/steps", {"index": 0, "kind": "tool_calls", "tool_calls": [call, call]})
    assert response.status_code == 422 and error_code(response) == "duplicate_tool_call_id"
    assert Run.objects.get(pk=run_id).steps == 0


def test_settle_totals_that_contradict_the_record_are_refused(agent, held_run):
    _, client = agent
    run_id = held_run()
    client.post(f"/runs/{run_id}/steps", {"index": 0, "kind": "message", "text": "a", "tokens_in": 10, "cost": 0.5})
    wrong = {"status": "completed", "reason": "completed", "totals": {"steps": 9, "tokens_in": 3}}
    response = client.post(f"/runs/{run_id}/settle", wrong)
    assert response.status_code == 422 and error_code(response) == "totals_mismatch"
    assert set(response.json()["error"]["fields"]) == {"steps", "tokens_in"}
    assert Run.objects.get(pk=run_id).status == "running"
    right = {"status": "completed", "reason": "completed", "totals": {"steps": 1, "tokens_in": 12, "cost": 0.5}}
    assert client.post(f"/runs/{run_id}/settle", right).status_code == 200
    run = Run.objects.get(pk=run_id)
    assert (run.steps, run.tokens_in) == (1, 12)


def test_offsets_are_code_points(agent, held_run):
    from runs.models import ApiInflight

    _, client = agent
    run_id = held_run()
    # "😀" is one code point (two UTF-16 units): the next delta starts at offset 2.
    events = [delta(0, 0, "a😀"), delta(0, 2, "b")]
    assert client.post(f"/runs/{run_id}/events", {"events": events}).status_code == 200
    assert ApiInflight.objects.get(run_id=run_id).text == "a😀b"


@pytest.mark.parametrize("verb", ["abort", "cancel"])
def test_abort_and_its_older_spelling_cancel_do_the_same(operator, held_run, verb):
    _, ops = operator
    run_id = held_run()
    response = ops.post(f"/runs/{run_id}/{verb}", {"note": "enough"})
    assert (response.status_code, response.json()["outcome"]) == (200, "requested")
    assert Run.objects.get(pk=run_id).cancel_note == "enough"
