"""An action's answer says what happened to that action, lands where live updates
never replace it (#outcome), and is true about what comes next."""

import re

import pytest

from runs import transitions
from runs.models import Run

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


def answer_of(response):
    """(the answer's text, the rest): the answer is the response's first element."""
    html = response.content.decode()
    first = re.match(r'\s*<p class="msg [^"]*" role="status" data-testid="outcome">(.*?)</p>', html, re.S)
    assert first, f"the answer is not the response's primary content:\n{html[:300]}"
    return first.group(1), html[first.end():]


def test_every_action_form_targets_the_answers_not_its_own_section(op_client, running_run):
    run = running_run()
    Run.objects.filter(pk=run.pk).update(heartbeat_at=run.created_at.replace(year=2000))  # stuck: Retire shows
    assert transitions.suspend(run.id, worker="w1", status="waiting_for_input", request={"prompt": "name?"})
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    forms = re.findall(r"<form [^>]*hx-post=[^>]*>", html)
    assert len(forms) >= 3  # abort, retire, send input
    for form in forms:
        assert 'hx-target="#outcome"' in form and 'hx-swap="afterbegin"' in form, form
    assert '<div id="outcome"' in html and 'id="ended"' in html


def test_retire_answers_for_itself_and_refreshes_the_actions_out_of_band(op_client, running_run):
    run = running_run()
    text, rest = answer_of(op_client.post(f"/runs/{run.id}/retire", **HX))
    assert "Retired" in text and "its late settle will be ignored" in text
    assert '<section id="run-actions" class="actions" hx-swap-oob="true">' in rest
    assert 'data-step="ended"' in rest  # the abort's steps end with it


def test_a_deny_says_the_run_will_fail(op_client, running_run):
    run = running_run()
    assert transitions.suspend(run.id, worker="w1", status="waiting_for_approval", request={"tool": "rm"})
    text, _ = answer_of(op_client.post(f"/runs/{run.id}/approve", {"decision": "deny"}, **HX))
    assert "Denied" in text and "ends failed (approval denied)" in text and "goes on" not in text


def test_send_input_answers_with_a_confirmation(op_client, running_run):
    run = running_run()
    assert transitions.suspend(run.id, worker="w1", status="waiting_for_input", request={"prompt": "name?"})
    text, rest = answer_of(op_client.post(f"/runs/{run.id}/input", {"text": "Ada"}, **HX))
    assert "Sent" in text and 'id="run-actions"' in rest
