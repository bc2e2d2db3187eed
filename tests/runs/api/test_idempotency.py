"""Idempotency-Key on create, claim, steps and settle: a replay returns the first answer."""

import threading

import pytest
from django.db import connection

from runs.api.idempotency import RETENTION, purge_expired
from runs.models import IdempotencyRecord, Run, RunEvent, Step
from tests.runs.api.conftest import ApiClient, error_code

STEP = {"index": 0, "kind": "message", "text": "hello", "tokens_in": 4}


def test_a_replayed_create_returns_the_first_run_and_creates_no_other(agent):
    _, client = agent
    first = client.post("/runs", {"agent": "go", "claim": True}, idempotency_key="create-1")
    again = client.post("/runs", {"agent": "go", "claim": True}, idempotency_key="create-1")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Run.objects.count() == 1


def test_a_replayed_step_is_committed_once(agent, held_run):
    run_id = held_run()
    _, client = agent
    first = client.post(f"/runs/{run_id}/steps", STEP, idempotency_key="s0")
    again = client.post(f"/runs/{run_id}/steps", STEP, idempotency_key="s0")
    assert (first.status_code, again.status_code) == (201, 201) and again.json() == first.json()
    run = Run.objects.get(pk=run_id)
    assert (run.steps, run.tokens_in, Step.objects.count()) == (1, 4, 1)
    # Without the key the same body is a different request: it is refused, not replayed.
    assert client.post(f"/runs/{run_id}/steps", STEP).status_code == 409


def test_a_replayed_settle_returns_200_again_not_409(agent, held_run):
    run_id = held_run()
    _, client = agent
    body = {"status": "completed", "reason": "completed"}
    first = client.post(f"/runs/{run_id}/settle", body, idempotency_key="end")
    again = client.post(f"/runs/{run_id}/settle", body, idempotency_key="end")
    assert first.json() == again.json() == {"settled": True, "status": "completed", "reason": "completed"}
    assert not RunEvent.objects.filter(run_id=run_id, kind="late_settle_ignored").exists()


def test_a_first_answer_that_was_a_409_is_replayed_as_that_409(agent, held_run):
    run_id = held_run()
    _, client = agent
    wrong = {**STEP, "index": 1}
    first = client.post(f"/runs/{run_id}/steps", wrong, idempotency_key="early")
    client.post(f"/runs/{run_id}/steps", STEP)  # now index 1 would fit
    again = client.post(f"/runs/{run_id}/steps", wrong, idempotency_key="early")
    assert first.status_code == again.status_code == 409 and again.json() == first.json()
    assert Run.objects.get(pk=run_id).steps == 1


def test_a_key_reused_for_another_request_is_a_422(agent, held_run):
    _, client = agent
    client.post("/runs", {"agent": "go"}, idempotency_key="k")
    response = client.post("/runs", {"agent": "rust"}, idempotency_key="k")
    assert response.status_code == 422 and error_code(response) == "idempotency_key_reused"
    assert Run.objects.count() == 1


def test_keys_are_scoped_to_the_caller(agent, other_agent):
    agent[1].post("/runs", {"agent": "go"}, idempotency_key="same")
    other_agent[1].post("/runs", {"agent": "go"}, idempotency_key="same")
    assert Run.objects.count() == 2


def test_a_replayed_claim_does_not_take_a_second_run(agent, make_run):
    make_run(agent="php"), make_run(agent="php")
    _, client = agent
    first = client.post("/runs/claim", {"agents": ["php"]}, idempotency_key="c")
    again = client.post("/runs/claim", {"agents": ["php"]}, idempotency_key="c")
    assert first.json()["id"] == again.json()["id"]
    assert Run.objects.filter(status="running").count() == 1


def test_expired_records_are_purged(agent):
    agent[1].post("/runs", {"agent": "go"}, idempotency_key="old")
    record = IdempotencyRecord.objects.get()
    assert purge_expired(now=record.created_at + RETENTION / 2) == 0
    assert purge_expired(now=record.created_at + RETENTION * 2) == 1


def test_concurrent_copies_of_one_create_make_one_run(postgres, make_key):
    _, token = make_key("racer")
    answers, barrier = [], threading.Barrier(8)

    def send():
        client = ApiClient(token)
        barrier.wait()
        answers.append(client.post("/runs", {"agent": "go", "claim": True}, idempotency_key="race"))
        connection.close()

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {response.status_code for response in answers} == {201}
    assert len({response.json()["id"] for response in answers}) == 1
    assert Run.objects.count() == 1


@pytest.mark.parametrize("body", [STEP])
def test_concurrent_copies_of_one_step_commit_it_once(postgres, make_key, body):
    _, token = make_key("racer")
    client = ApiClient(token)
    run_id = client.post("/runs", {"agent": "go", "claim": True}).json()["id"]
    answers, barrier = [], threading.Barrier(6)

    def send():
        barrier.wait()
        answers.append(ApiClient(token).post(f"/runs/{run_id}/steps", body, idempotency_key="step-0"))
        connection.close()

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [response.status_code for response in answers] == [201] * 6
    assert Step.objects.filter(run_id=run_id).count() == 1 and Run.objects.get(pk=run_id).tokens_in == 4
