"""The complete agent in clients/python/README.md stays ≤ 15 lines and runs: streamed,
committed, its approval answered, settled completed."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runs.models import Run, Step

README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"


def readme_agent():
    return re.search(r"## A complete agent\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)


def test_the_readme_agent_is_at_most_15_lines():
    assert len(readme_agent().strip().splitlines()) <= 15


@pytest.mark.django_db(transaction=True)
def test_the_readme_agent_runs_to_completion(live_server_url, agent_key, answering, tmp_path):
    answered = answering("summariser", lambda request: request.get("tool") == "send_mail")
    (tmp_path / "a.txt").write_text("one two three")
    (tmp_path / "agent.py").write_text(readme_agent())
    env = {**os.environ, "RUNWARDEN_URL": live_server_url, "RUNWARDEN_KEY": agent_key}
    done = subprocess.run([sys.executable, "agent.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    run = Run.objects.get(agent="summariser")
    assert (run.status, run.termination_reason, answered) == ("completed", "completed", [True])
    assert list(Step.objects.filter(run=run).order_by("index").values_list("text", flat=True)) == [
        "one two three ", "mailed"]
