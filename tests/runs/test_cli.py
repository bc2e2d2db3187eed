"""`manage.py runs …`: exit codes and what an operator reads."""

import os
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from runs import transitions
from runs.models import Run, RunEvent
from tests.runs.conftest import LONG_AGO

pytestmark = pytest.mark.django_db


def runs(*args):
    out = StringIO()
    call_command("runs", *args, stdout=out)
    return out.getvalue()


def exit_code(*args):
    try:
        runs(*args)
    except CommandError as error:
        return error.returncode, str(error)
    return 0, ""


@pytest.mark.parametrize("verb", ["abort", "cancel"])  # `cancel`: the old spelling, kept as an alias
def test_abort_running_run_requests_and_records_cli_source(running_run, verb):
    run = running_run()
    assert "Abort requested" in runs(verb, str(run.id), "--note", "stuck in a loop")
    run.refresh_from_db()
    assert (run.cancel_source, run.cancel_note, run.status) == ("cli", "stuck in a loop", "running")
    assert "already requested" in runs(verb, str(run.id))


def test_cli_actions_name_the_operating_system_user(running_run, monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    aborted, retired = running_run(), running_run()
    runs("abort", str(aborted.id))
    runs("retire", str(retired.id))
    assert Run.objects.get(pk=aborted.id).cancel_requested_by == "alice"
    assert RunEvent.objects.get(run=retired, kind="retired").actor == "alice"
    assert {e.source for e in RunEvent.objects.filter(kind__in=["cancel_requested", "retired"])} == {"cli"}


def test_cancel_queued_run_settles(make_run):
    run = make_run()
    assert "cancelled at once" in runs("cancel", str(run.id))
    assert Run.objects.get(pk=run.id).status == "cancelled"


def test_cancel_terminal_run_exits_1_with_status_and_reason(run_in):
    run = run_in("failed")
    code, message = exit_code("abort", str(run.id))
    assert code == 1 and "Nothing to abort" in message and "failed / provider failed" in message


@pytest.mark.parametrize("bad", ["nope", "00000000-0000-0000-0000-000000000000"])
def test_cancel_unknown_or_malformed_id_exits_2(bad):
    assert exit_code("abort", bad)[0] == 2
    assert exit_code("cancel", bad, "--force")[0] == 2
    assert exit_code("retire", bad)[0] == 2
    assert exit_code("show", bad)[0] == 2


@pytest.mark.parametrize("argv", [("retire",), ("cancel", "--force")])  # --force: the old spelling
def test_retire_and_a_second_retire_exits_1(running_run, argv):
    run = running_run()
    assert "Retired" in runs(argv[0], str(run.id), *argv[1:], "--note", "worker gone")
    assert RunEvent.objects.get(run=run, kind="retired").data["note"] == "worker gone"
    code, message = exit_code(argv[0], str(run.id), *argv[1:])
    assert code == 1 and "Nothing to retire" in message


def test_show_prints_fields_and_timeline(running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="alice", note="why not")
    out = runs("show", str(run.id))
    assert str(run.id) in out and "running" in out and "alice via dashboard (why not)" in out
    assert "claimed" in out and "cancel_requested" in out


def test_show_says_a_released_wait_has_no_worker_and_when_it_ends(released_in):
    run = released_in()
    out = runs("show", str(run.id))
    assert "released while it waits" in out and "waits until" in out and str(run.wait_deadline.year) in out


def test_list_filters_by_status(make_run, running_run):
    queued, running = make_run(title="waiting one"), running_run(title="busy one")
    out = runs("list", "--status", "running")
    assert str(running.id) in out and str(queued.id) not in out
    assert "waiting one" in runs("list")


def test_stuck_and_reap(running_run):
    from datetime import timedelta

    from django.utils import timezone

    stale, fresh = running_run(), running_run()
    Run.objects.filter(pk=stale.id).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    out = StringIO()
    with pytest.raises(CommandError) as found:
        call_command("runs", "stuck", "--older-than", "30s", stdout=out)
    assert found.value.returncode == 1 and str(found.value) == "1 stuck run(s)"
    assert str(stale.id) in out.getvalue() and str(fresh.id) not in out.getvalue()
    out = runs("reap", "--older-than", "60s")
    assert "reaped 1 run(s)" in out and str(stale.id) in out
    assert Run.objects.get(pk=stale.id).termination_reason == "worker_lost"
    assert Run.objects.get(pk=fresh.id).status == "running"


def test_stuck_exits_0_when_there_are_none(running_run):
    running_run()  # fresh heartbeat
    assert exit_code("stuck", "--older-than", "30s") == (0, "")


def test_bad_duration_exits_2():
    assert exit_code("reap", "--older-than", "soon")[0] == 2


@pytest.mark.django_db(transaction=True)
def test_real_process_exit_codes(run_in):
    """The codes a shell script sees, from a real `manage.py` process."""
    done = run_in("completed")
    env = {**os.environ, "DATABASE_URL": _database_url(), "SECRET_KEY": "x"}
    manage = [sys.executable, str(settings.BASE_DIR / "manage.py"), "runs", "cancel"]
    terminal = subprocess.run([*manage, str(done.id)], env=env, capture_output=True, text=True)
    unknown = subprocess.run([*manage, "not-a-run"], env=env, capture_output=True, text=True)
    assert (terminal.returncode, unknown.returncode) == (1, 2)
    assert "completed / completed" in terminal.stderr


def _database_url():
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def test_reap_table_uses_watchdog_source(running_run):
    run = running_run()
    transitions.reap_stale(older_than=LONG_AGO)
    assert RunEvent.objects.get(run=run, kind="reaped").source == "watchdog"


def test_bench_waits_refuses_a_count_below_one_in_one_line(db):
    with pytest.raises(CommandError, match="at least 1"):
        call_command("bench_waits", "--waiting", "0")
