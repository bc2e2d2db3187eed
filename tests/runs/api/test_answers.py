"""Operator answers reach API agents: GET, long-poll, ack; in order, once acked;
a denied tool cannot be committed."""

import pytest

from runs import transitions
from tests.runs.api.conftest import error_code

pytestmark = pytest.mark.django_db

APPROVAL = {"tool": "drop_table", "args": {"name": "users"}, "call_id": "c7"}


def waiting(agent, held_run, status="waiting_for_approval", request=APPROVAL):
    _, client = agent
    run_id = held_run()
    assert client.post(f"/runs/{run_id}/suspend", {"status": status, "request": request}).status_code == 200
    return client, run_id


def test_a_denial_with_its_note_and_request_is_listed_until_acknowledged(agent, held_run):
    client, run_id = waiting(agent, held_run)
    assert transitions.resume(run_id, by="alice", answer={"approved": False, "note": "not on prod"})
    (answer,) = client.get(f"/runs/{run_id}/inputs").json()["inputs"]
    assert (answer["kind"], answer["approved"], answer["note"], answer["by"]) == ("approval", False, "not on prod", "alice")
    assert answer["request"] == APPROVAL
    assert client.get(f"/runs/{run_id}/inputs").json()["inputs"][0]["id"] == answer["id"]  # again, until acked
    acked = client.post(f"/runs/{run_id}/inputs/{answer['id']}/ack")
    assert acked.json() == {"id": answer["id"], "acked": True, "first": True}
    assert client.get(f"/runs/{run_id}/inputs").json()["inputs"] == []
    assert client.post(f"/runs/{run_id}/inputs/{answer['id']}/ack").json()["first"] is False


def test_answers_come_in_order(agent, held_run):
    client, run_id = waiting(agent, held_run, "waiting_for_input", {"prompt": "first?"})
    assert transitions.resume(run_id, by="alice", answer={"text": "one"})
    first = client.get(f"/runs/{run_id}/inputs").json()["inputs"][0]
    client.post(f"/runs/{run_id}/inputs/{first['id']}/ack")
    assert client.post(f"/runs/{run_id}/suspend", {"status": "waiting_for_approval", "request": APPROVAL}).status_code == 200
    assert transitions.resume(run_id, by="bob", answer={"approved": True})
    (second,) = client.get(f"/runs/{run_id}/inputs").json()["inputs"]
    assert (first["text"], second["approved"], second["request"]) == ("one", True, APPROVAL)
    assert second["id"] > first["id"]


def test_the_long_poll_answers_at_once_with_an_unacknowledged_answer(agent, held_run):
    client, run_id = waiting(agent, held_run)
    assert transitions.resume(run_id, by="alice", answer={"approved": True})
    response = client.get(f"/runs/{run_id}/control?wait=30")
    assert response.status_code == 200
    body = response.json()
    assert (body["cancel"], body["held"], [a["approved"] for a in body["inputs"]]) == (None, True, [True])


def test_steps_and_suspend_wait_for_the_ack(agent, held_run):
    client, run_id = waiting(agent, held_run)
    assert transitions.resume(run_id, by="alice", answer={"approved": True})
    step = {"index": 0, "kind": "message", "text": "done"}
    assert error_code(client.post(f"/runs/{run_id}/steps", step)) == "answer_pending"
    assert error_code(client.post(f"/runs/{run_id}/suspend", {"status": "waiting_for_input"})) == "answer_pending"
    answer = client.get(f"/runs/{run_id}/inputs").json()["inputs"][0]
    client.post(f"/runs/{run_id}/inputs/{answer['id']}/ack")
    assert client.post(f"/runs/{run_id}/steps", step).status_code == 201


def test_a_denied_tool_call_cannot_be_committed(agent, held_run):
    client, run_id = waiting(agent, held_run)
    assert transitions.resume(run_id, by="alice", answer={"approved": False})
    answer = client.get(f"/runs/{run_id}/inputs").json()["inputs"][0]
    client.post(f"/runs/{run_id}/inputs/{answer['id']}/ack")
    call = {"id": "c7", "name": "drop_table", "args": {"name": "users"}, "result": "dropped"}
    response = client.post(f"/runs/{run_id}/steps", {"index": 0, "kind": "tool_calls", "tool_calls": [call]})
    assert response.status_code == 422 and error_code(response) == "tool_denied"
    other = {**call, "id": "c8", "name": "read_table"}
    assert client.post(f"/runs/{run_id}/steps", {"index": 0, "kind": "tool_calls", "tool_calls": [other]}).status_code == 201


def test_another_key_neither_sees_nor_acks_the_answers(agent, other_agent, operator, held_run):
    client, run_id = waiting(agent, held_run)
    assert transitions.resume(run_id, by="alice", answer={"approved": True})
    answer = client.get(f"/runs/{run_id}/inputs").json()["inputs"][0]
    _, ops = operator
    assert ops.get(f"/runs/{run_id}/inputs").json()["inputs"] == []  # not the holder
    assert error_code(ops.post(f"/runs/{run_id}/inputs/{answer['id']}/ack")) == "input_not_found"
    _, other = other_agent
    assert error_code(other.post(f"/runs/{run_id}/inputs/{answer['id']}/ack")) == "not_your_run"
    assert len(client.get(f"/runs/{run_id}/inputs").json()["inputs"]) == 1
