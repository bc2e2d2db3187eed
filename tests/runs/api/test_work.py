"""Heartbeat, steps, settle, suspend, and the operator's cancel and retire."""

import pytest

from runs import transitions
from runs.models import Run, RunEvent, Step
from tests.runs.api.conftest import error_code

STEP = {"index": 0, "kind": "tool_calls", "text": "calling", "tokens_in": 5, "tokens_out": 7, "cost": "0.25",
        "tool_calls": [{"id": "c1", "name": "search", "args": {"q": "x"}, "result": "found"}]}


def test_heartbeat_says_held_and_whether_a_cancel_is_pending(agent, held_run):
    run_id = held_run()
    _, client = agent
    assert client.post(f"/runs/{run_id}/heartbeat").json() == {
        "held": True, "cancel_requested": False, "stop_reason": None, "status": "running",
    }
    transitions.request_cancel(run_id, by="alice")
    assert client.post(f"/runs/{run_id}/heartbeat").json()["cancel_requested"] is True


def test_heartbeat_on_an_ended_run_says_not_held(agent, held_run):
    run_id = held_run()
    transitions.retire(run_id, by="alice")
    assert agent[1].post(f"/runs/{run_id}/heartbeat").json() == {
        "held": False, "cancel_requested": True, "stop_reason": None, "status": "cancelled",
    }


def test_a_step_is_committed_whole_and_added_to_the_totals(agent, held_run):
    run_id = held_run()
    response = agent[1].post(f"/runs/{run_id}/steps", STEP)
    assert response.status_code == 201 and response.json() == {"committed": True, "index": 0}
    step = Step.objects.get(run_id=run_id)
    assert step.tool_calls == [{"id": "c1", "name": "search", "args": {"q": "x"}, "result": "found"}]
    run = Run.objects.get(pk=run_id)
    assert (run.steps, run.tool_calls, run.tokens_in, run.tokens_out, str(run.cost)) == (1, 1, 5, 7, "0.250000")


def test_a_tool_call_without_its_result_is_refused(agent, held_run):
    run_id = held_run()
    response = agent[1].post(f"/runs/{run_id}/steps", {**STEP, "tool_calls": [{"id": "c1", "name": "search"}]})
    assert response.status_code == 422
    assert not Step.objects.exists()


def test_a_step_out_of_order_is_a_409_naming_the_next_index(agent, held_run):
    run_id = held_run()
    response = agent[1].post(f"/runs/{run_id}/steps", {**STEP, "index": 1})
    assert response.status_code == 409
    assert error_code(response) == "wrong_index" and response.json()["error"]["fields"] == {"index": "expected 0"}


def test_no_step_is_committed_once_a_cancel_is_pending(agent, held_run):
    run_id = held_run()
    transitions.request_cancel(run_id, by="alice")
    response = agent[1].post(f"/runs/{run_id}/steps", STEP)
    assert response.status_code == 409 and error_code(response) == "cancel_requested"
    assert not Step.objects.exists()


def test_settle_ends_the_run(agent, held_run):
    run_id = held_run()
    body = {"status": "completed", "reason": "max_iterations", "truncated": True,
            "totals": {"tokens_in": 10, "cost": 0.5, "steps": 0}}
    response = agent[1].post(f"/runs/{run_id}/settle", body)
    assert response.json() == {"settled": True, "status": "completed", "reason": "max_iterations"}
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.truncated, run.tokens_in, str(run.cost)) == ("completed", True, 10, "0.500000")


def test_a_late_settle_is_a_409_and_keeps_the_first_outcome(agent, held_run):
    run_id = held_run()
    _, client = agent
    client.post(f"/runs/{run_id}/settle", {"status": "failed", "reason": "provider_failed", "error_message": "503"})
    response = client.post(f"/runs/{run_id}/settle", {"status": "completed", "reason": "completed"})
    assert response.status_code == 409
    body = response.json()
    assert (body["settled"], body["status"], body["reason"]) == (False, "failed", "provider_failed")
    assert error_code(response) == "run_ended"
    assert RunEvent.objects.filter(run_id=run_id, kind="late_settle_ignored").count() == 1


def test_an_impossible_status_reason_pair_is_a_422_not_a_500(agent, held_run):
    run_id = held_run()
    for body in ({"status": "completed", "reason": "cancelled"}, {"status": "failed", "reason": "completed"},
                 {"status": "completed", "reason": "completed", "truncated": True}):
        response = agent[1].post(f"/runs/{run_id}/settle", body)
        assert response.status_code == 422, body
    assert Run.objects.get(pk=run_id).status == "running"


def test_a_failure_while_a_cancel_is_pending_is_recorded_as_cancelled(agent, held_run):
    run_id = held_run()
    transitions.request_cancel(run_id, by="alice")
    response = agent[1].post(f"/runs/{run_id}/settle", {"status": "failed", "reason": "provider_failed"})
    assert response.json() == {"settled": True, "status": "cancelled", "reason": "cancelled"}


def test_settling_a_queued_run_is_a_409_that_changes_nothing(agent):
    _, client = agent
    run_id = client.post("/runs", {"agent": "x"}).json()["id"]
    response = client.post(f"/runs/{run_id}/settle", {"status": "completed", "reason": "completed"})
    assert response.status_code == 409 and error_code(response) == "not_claimed"
    assert Run.objects.get(pk=run_id).status == "queued"


def test_suspend_parks_the_run_and_refuses_when_a_cancel_is_pending(agent, held_run):
    first, second = held_run(), held_run()
    _, client = agent
    body = {"status": "waiting_for_approval", "request": {"tool": "rm", "args": ["-rf", "/tmp/x"]}}
    assert client.post(f"/runs/{first}/suspend", body).json()["suspended"] is True
    assert Run.objects.get(pk=first).pending_request == body["request"]
    transitions.request_cancel(second, by="alice")
    response = client.post(f"/runs/{second}/suspend", body)
    assert response.status_code == 409 and error_code(response) == "cancel_requested"


@pytest.mark.parametrize("verb", ["abort", "cancel"])  # /cancel: the old path, kept as an alias
def test_an_operator_aborts_a_live_run_and_a_queued_one(operator, held_run, make_run, verb):
    live, queued = held_run(), make_run()
    _, client = operator
    assert client.post(f"/runs/{live}/{verb}", {"note": "over budget"}).json() == {
        "outcome": "requested", "status": "running", "reason": ""}
    assert client.post(f"/runs/{live}/{verb}").json()["outcome"] == "already_requested"
    assert client.post(f"/runs/{queued.id}/{verb}").json() == {"outcome": "settled", "status": "cancelled", "reason": "cancelled"}
    run = Run.objects.get(pk=live)
    assert (run.status, run.cancel_source, run.cancel_requested_by, run.cancel_note) == ("running", "api", "api:ops", "over budget")


def test_an_operator_retires_a_run_and_a_second_retire_is_a_409(operator, held_run):
    run_id = held_run()
    _, client = operator
    assert client.post(f"/runs/{run_id}/retire", {"note": "worker gone"}).json()["retired"] is True
    response = client.post(f"/runs/{run_id}/retire")
    assert response.status_code == 409 and response.json()["status"] == "cancelled"
    assert client.post(f"/runs/{run_id}/cancel").status_code == 409
    assert client.post(f"/runs/{run_id}/abort").status_code == 409


def test_a_committed_step_counts_as_a_heartbeat_so_a_busy_agent_is_not_reaped(agent, held_run):
    from datetime import timedelta

    from django.utils import timezone

    run_id = held_run()
    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert agent[1].post(f"/runs/{run_id}/steps", STEP).status_code == 201
    assert transitions.reap_stale(older_than=timedelta(minutes=1)) == []
    assert Run.objects.get(pk=run_id).status == "running"


def test_a_discarded_step_is_recorded_with_its_spend_in_the_totals(agent, held_run):
    run_id = held_run()
    _, client = agent
    assert client.post(f"/runs/{run_id}/steps", STEP).status_code == 201
    transitions.request_cancel(run_id, by="alice")
    body = {"index": 1, "text": "half a thou", "tool_calls": ["search"], "tokens_in": 30, "tokens_out": 4,
            "cost": "0.5", "estimated": True}
    response = client.post(f"/runs/{run_id}/discard", body)
    assert response.status_code == 201 and response.json() == {"discarded": True, "index": 1}
    run = Run.objects.get(pk=run_id)
    assert (run.tokens_in, run.tokens_out, str(run.cost), run.steps) == (35, 11, "0.750000", 1)
    event = RunEvent.objects.get(run_id=run_id, kind="step_discarded")
    assert event.data["text"] == "half a thou" and event.data["tool_calls"] == ["search"]
    assert (event.data["tokens_out"], event.data["cost"], event.data["estimated"]) == (4, "0.5", True)
    assert client.post(f"/runs/{run_id}/settle", {"status": "cancelled", "reason": "cancelled"}).status_code == 200


def test_a_discard_on_a_run_that_ended_changes_nothing(agent, held_run):
    run_id = held_run()
    transitions.retire(run_id, by="alice")
    response = agent[1].post(f"/runs/{run_id}/discard", {"index": 0, "tokens_out": 9})
    assert response.status_code == 409 and error_code(response) == "run_ended"
    assert Run.objects.get(pk=run_id).tokens_out == 0
    assert not RunEvent.objects.filter(run_id=run_id, kind="step_discarded").exists()
