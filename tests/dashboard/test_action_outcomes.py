"""Each action checks the state it answers, in its transition, and says what happened
in the outcome's own words (issue 12: approving a run that waits for input was a 200)."""

import uuid

import pytest

from runs import transitions
from runs.models import Run, RunInput
from runs.transitions import ResumeOutcome, RetireOutcome

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def waiting(running_run, released_in):
    def make(status, released=False):
        if released:
            return released_in(status)
        run = running_run()
        assert transitions.suspend(run.id, worker="w1", status=status, request={"prompt": "?"})
        return run

    return make


@pytest.mark.parametrize("released", [False, True])
def test_approve_refuses_a_run_waiting_for_input(op_client, waiting, released):
    run = waiting("waiting_for_input", released)
    response = op_client.post(f"/runs/{run.id}/approve", {"decision": "approve"}, **HX)
    assert response.status_code == 409
    assert ResumeOutcome.WAITS_FOR_INPUT.label in response.content.decode()
    assert Run.objects.get(pk=run.id).status == "waiting_for_input"
    assert not RunInput.objects.filter(run=run).exists()


@pytest.mark.parametrize("released", [False, True])
def test_send_input_refuses_a_run_waiting_for_approval(op_client, waiting, released):
    run = waiting("waiting_for_approval", released)
    response = op_client.post(f"/runs/{run.id}/input", {"text": "yes please"}, **HX)
    assert response.status_code == 409
    assert ResumeOutcome.WAITS_FOR_APPROVAL.label in response.content.decode()
    assert Run.objects.get(pk=run.id).status == "waiting_for_approval"
    assert not RunInput.objects.filter(run=run).exists()


def test_a_denial_does_not_say_the_run_goes_on(op_client, waiting):
    run = waiting("waiting_for_approval", released=True)
    html = op_client.post(f"/runs/{run.id}/approve", {"decision": "deny"}, **HX).content.decode()
    assert "Denied" in html and "approval denied" in html and "goes on" not in html
    assert RunInput.objects.get(run=run).kind == "approval"


def test_an_input_answer_is_queued_as_a_message(op_client, waiting):
    run = waiting("waiting_for_input", released=True)
    response = op_client.post(f"/runs/{run.id}/input", {"text": "the blue one"}, **HX)
    assert response.status_code == 200 and ResumeOutcome.REQUEUED.label in response.content.decode()
    assert RunInput.objects.get(run=run).kind == "message"


def test_retire_says_its_own_confirmation(op_client, running_run):
    run = running_run()
    response = op_client.post(f"/runs/{run.id}/retire", **HX)
    assert response.status_code == 200 and "its late settle will be ignored" in response.content.decode()
    again = op_client.post(f"/runs/{run.id}/retire", **HX)
    assert again.status_code == 409 and RetireOutcome.ALREADY_TERMINAL.label in again.content.decode()


@pytest.mark.parametrize("action, body", [("cancel", {}), ("retire", {}), ("retry", {}),
                                          ("approve", {"decision": "approve"}), ("input", {"text": "hi"})])
def test_every_action_on_an_unknown_run_is_404(op_client, action, body):
    response = op_client.post(f"/runs/{uuid.uuid4()}/{action}", body, **HX)
    assert response.status_code == 404 and "No such run." in response.content.decode()
