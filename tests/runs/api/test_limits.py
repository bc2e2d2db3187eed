"""Size limits and hostile input: always a 4xx in the error shape, never a 500, and the
run is left exactly as it was."""

import json

import pytest

from runs.api.parsing import MAX_BODY_BYTES
from runs.models import Run, RunEvent, Step
from tests.runs.api.conftest import error_code


def snapshot(run_id):
    return (Run.objects.values().get(pk=run_id), Step.objects.filter(run_id=run_id).count(),
            RunEvent.objects.filter(run_id=run_id).count())


def delta(i, text="x"):
    return {"type": "delta", "step": 0, "offset": i, "text": text}


def test_500_events_are_accepted_and_501_are_a_413(agent, held_run):
    run_id = held_run()
    _, client = agent
    assert client.post(f"/runs/{run_id}/events", {"events": [delta(i) for i in range(500)]}).status_code == 200
    response = client.post(f"/runs/{run_id}/events", {"events": [delta(i) for i in range(501)]})
    assert response.status_code == 413 and error_code(response) == "too_large"


def test_a_body_over_1_mib_is_a_413_on_every_endpoint(agent, held_run):
    run_id = held_run()
    _, client = agent
    text = "y" * (MAX_BODY_BYTES - 100)
    fits = json.dumps({"events": [delta(0, text)]})
    assert len(fits) <= MAX_BODY_BYTES
    assert client.post(f"/runs/{run_id}/events", raw=fits).status_code == 200  # and beats
    before = snapshot(run_id)
    over = json.dumps({"events": [delta(0, text + "y" * 200)]})
    for path in ("/runs", f"/runs/{run_id}/events", f"/runs/{run_id}/steps", f"/runs/{run_id}/settle"):
        response = client.post(path, raw=over)
        assert response.status_code == 413, path
        assert error_code(response) == "too_large"
    assert snapshot(run_id) == before


HOSTILE_BODIES = [
    b"{not json", b"\xff\xfe{}", b"[" * 5000 + b"]" * 5000, b'{"a":' * 40 + b"1" + b"}" * 40,
    b'{"index": NaN, "kind": "message"}', b'{"index": 1e999, "kind": "message"}', b'{"index": ' + b"9" * 5000 + b"}",
    b'{"index": 0, "kind": "message", "text": "a\\u0000b"}', b'{"index": 0, "kind": "message", "text": "\\ud800"}',
    b'{"index": 0, "kind": "message", "tool_calls": [{"id": "c", "name": "n", "result": {"\\u0000": 1}}]}',
    b'{"index": -1, "kind": "message"}', b'{"index": 4294967296, "kind": "message"}', b'{"index": 0, "kind": "nope"}',
    b'{"index": 0, "kind": "message", "cost": "1e20"}', b'{"index": 0, "kind": "message", "cost": "0.0000001"}',
    b'{"index": 0, "kind": "message", "tokens_in": true}', b'{"index": 0, "kind": "message", "tool_calls": ["str"]}',
    b"null", b"[]", b'"text"', b"1",
]


@pytest.mark.parametrize("body", HOSTILE_BODIES)
def test_a_hostile_step_body_is_a_4xx_and_changes_nothing(agent, held_run, body):
    run_id = held_run()
    before = snapshot(run_id)
    response = agent[1].post(f"/runs/{run_id}/steps", raw=body)
    assert 400 <= response.status_code < 500, response.content
    error_code(response)
    assert snapshot(run_id) == before


@pytest.mark.parametrize("body", [
    {"status": "completed", "reason": "completed", "totals": {"tokens_in": -1}},
    {"status": "completed", "reason": "completed", "totals": {"cost": "NaN"}},
    {"status": "completed", "reason": "completed", "totals": {"tool_calls": 2**40}},
    {"status": "completed", "reason": "completed", "totals": {"wallclock": 3}},
    {"status": "running", "reason": ""}, {"status": "completed", "reason": "completed", "error_class": "E" * 201},
])
def test_a_hostile_settle_body_is_a_422_and_changes_nothing(agent, held_run, body):
    run_id = held_run()
    before = snapshot(run_id)
    response = agent[1].post(f"/runs/{run_id}/settle", body)
    assert response.status_code == 422, response.content
    assert snapshot(run_id) == before


@pytest.mark.parametrize("body", [
    {"agent": "x", "input": "not an object"}, {"agent": "x", "deadline": "9999-12-31T23:59:59-23:59"},
    {"agent": "x", "deadline": "0001-01-01T00:00:00+14:00"}, {"agent": "x" * 101}, {"agent": "x", "cost_budget": "Infinity"},
    {"agent": "x", "claim": "maybe"}, {"agent": ["x"]},
])
def test_a_hostile_create_body_is_a_4xx_and_creates_nothing(agent, body):
    response = agent[1].post("/runs", body)
    assert 400 <= response.status_code < 500, response.content
    assert not Run.objects.exists()


@pytest.mark.parametrize("key", ["", "x" * 201, "ключ", "a\tb"])
def test_a_malformed_idempotency_key_is_a_400(agent, key):
    response = agent[1].post("/runs", {"agent": "x"}, idempotency_key=key)
    assert response.status_code == 400 and error_code(response) == "bad_idempotency_key"
    assert not Run.objects.exists()


@pytest.mark.parametrize("wait", ["-1", "nan", "abc"])
def test_a_bad_wait_is_a_422(agent, held_run, wait):
    run_id = held_run()
    assert agent[1].get(f"/runs/{run_id}/control?wait={wait}").status_code == 422
