"""Real agent processes past their token budget (budget_agent.py), on the live server:
the server's budget check asks the stop; one that obeys ends completed/budget_exhausted,
truncated, having seen `Stopped`; one that ignores it is escalated by the watchdog (not
honoured → hard stop → retired) and still ends completed/budget_exhausted, not cancelled."""

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runs import watchdog
from runs.api.auth import create_key
from runs.models import Run, RunEvent
from tests.conftest import _layer_env
from tests.runs.test_watchdog import age_cancel, age_escalation

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.django_db(transaction=True)


class Agent:
    """budget_agent.py in `mode`, its stdout read line by line with a timeout (a hung
    agent fails the test by name instead of hanging it)."""

    def __init__(self, mode, url, key):
        self.process = subprocess.Popen([sys.executable, "tests/runs/api/budget_agent.py", mode, url, key], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def line(self, timeout=30):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        assert line is not None, f"the agent said nothing more: {self.stderr()}"
        return line

    def stderr(self):
        self.process.kill()
        return self.process.stderr.read()[-3000:]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait(10)


def kinds(run_id):
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))


def test_an_agent_streaming_past_its_token_budget_is_stopped_and_ends_budget_exhausted(live_server_url):
    with Agent("obey", live_server_url, create_key("budget-obey")[1]) as agent:
        run_id = agent.line()
        report = json.loads(agent.line())
        assert agent.process.wait(timeout=30) == 0
    assert (report["caught"], report["reason"]) == ("Stopped", "budget_exhausted")
    assert report["settled"] == {"settled": True, "status": "completed", "reason": "budget_exhausted"}
    row = Run.objects.get(pk=run_id)
    assert (row.status, row.termination_reason, row.truncated) == ("completed", "budget_exhausted", True)
    assert row.steps == 3  # 10 tokens a step: the one that reached the budget is kept, the next discarded
    assert sum(s.tokens_in + s.tokens_out for s in row.step_set.all()) == 30
    (event,) = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.STOP_REQUESTED)
    assert (event.data["reason"], event.data["limit"], event.data["budget"]) == ("budget_exhausted", "tokens", "30")
    assert "cancel_requested" not in kinds(run_id)


def test_an_agent_that_ignores_the_stop_is_escalated_then_ends_budget_exhausted(live_server_url):
    with Agent("ignore", live_server_url, create_key("budget-ignore")[1]) as agent:
        run_id = agent.line()
        frame = json.loads(agent.line())  # its step crossed the budget: the socket says stop
        assert (frame["type"], frame["reason"], frame["source"]) == ("stop", "budget_exhausted", "guardrail")
        run = Run.objects.get(pk=run_id)
        assert run.stop_reason == "budget_exhausted" and run.status == "running"  # it beats on, ignoring it
        age_cancel(run, 31)  # the grace has passed: not honoured
        report = watchdog.sweep(stuck_s=600, grace_s=30, escalate_s=30, reap_s=600)
        assert report.escalated == [run.id] and report.retired == []
        if _layer_env():  # the sweep runs here: its hard stop reaches the server's socket over a shared layer only
            hard = json.loads(agent.line())
            assert (hard["type"], hard["hard"]) == ("cancel", True)
        age_escalation(run, 31)
        assert watchdog.sweep(stuck_s=600, grace_s=30, escalate_s=30, reap_s=600).retired == [run.id]
        late = agent.line()  # its next beat says "not held": it settles anyway, and loses
        assert agent.process.wait(timeout=30) == 0
    assert late.startswith("409 ") and '"run_ended"' in late
    row = Run.objects.get(pk=run_id)
    assert (row.status, row.termination_reason, row.truncated) == ("completed", "budget_exhausted", True)
    assert [k for k in kinds(run_id) if k in ("stop_requested", "cancel_not_honoured", "retired", "late_settle_ignored")
            ] == ["stop_requested", "cancel_not_honoured", "retired", "late_settle_ignored"]
