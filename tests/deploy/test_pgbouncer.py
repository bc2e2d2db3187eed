"""PgBouncer in transaction mode in front of PostgreSQL: the important paths still work.

Debian's pgbouncer (pool_mode = transaction, 4 server connections) between the test
database and two `run_agents` workers, a daphne server and the CLI, all started from the
systemd units' command lines with DATABASE_URL pointing at pgbouncer and
RUNWARDEN_PGBOUNCER=1. In transaction mode a client gets a server connection for one
transaction only (handed out round-robin here), so anything session-bound (SET, advisory
locks, LISTEN, prepared statements, server-side cursors) breaks here. Without
RUNWARDEN_PGBOUNCER's server-side cursors off, the audit CSV export (`.iterator()`) does.
PostgreSQL pass only.
"""

import os
import subprocess
import sys

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.db import connection

from runs import groups, transitions
from runs.api.auth import create_key
from runs.models import Run, RunEvent, Step
from tests.deploy.conftest import (
    PGBOUNCER,
    ROOT,
    Service,
    missing,
    start_pgbouncer,
    stop_all,
    unit_commands,
    unit_environment,
)
from tests.runs.agent.test_e2e_worker import Listening, wait_until

REQUIRE_POSTGRES = os.environ.get("REQUIRE_POSTGRES", "0") == "1"
LISTENING = r"Listening on TCP address 127\.0\.0\.1:(\d+)"


def words(n):
    return " ".join(f"w{i}" for i in range(n))


# At least ~3 s each: no run ends before both workers have claimed their share.
SHORT = [{"say": words(60), "token_delay_ms": 25}, {"tools": [{"name": "echo", "args": {"n": 1}}]},
         {"say": words(60), "token_delay_ms": 25}]
LONG = [{"say": words(600), "token_delay_ms": 20}]


@pytest.fixture
def through_pgbouncer(postgres, tmp_path):
    """Start pgbouncer, then 2 workers (4 runs each at most) and a daphne server on it."""
    if not os.path.exists(PGBOUNCER):
        missing("pgbouncer", "pgbouncer", required=REQUIRE_POSTGRES)
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL")
    services = []
    try:
        bouncer, port = start_pgbouncer(log_dir=tmp_path, pool_size=4)
        services.append(bouncer)
        db = connection.settings_dict
        env = unit_environment(
            DATABASE_URL=f"postgres://{db['USER']}@127.0.0.1:{port}/{db['NAME']}", RUNWARDEN_PGBOUNCER="1",
            REDIS_URL=settings.REDIS_URL, RUNWARDEN_CHANNEL_PREFIX=settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
            # The test's own secret key: the sessions it makes are valid on the server.
            SECRET_KEY=settings.SECRET_KEY, ALLOWED_HOSTS="127.0.0.1", STATIC_ROOT=str(settings.STATIC_ROOT),
            RUNWARDEN_WORKSPACE=str(tmp_path / "workspace"), RUNWARDEN_WORKER_CONCURRENCY="4",
            RUNWARDEN_HEARTBEAT_S="0.2", RUNWARDEN_CLAIM_POLL_S="0.1",
        )
        for name in ("1", "2"):
            (argv,) = unit_commands("runwarden-worker@.service", instance=name, env=env)
            services.append(Service(f"worker-{name}", argv, env=env, log_dir=tmp_path))
        (argv,) = unit_commands("runwarden-web@.service", instance="0", env=env)
        web = Service("web", argv, env=env, log_dir=tmp_path)
        services.append(web)
        workers = [services[1].wait_for(r"worker (\S+) ready").group(1), services[2].wait_for(r"worker (\S+) ready").group(1)]
        base = f"http://127.0.0.1:{web.wait_for(LISTENING).group(1)}"
        yield {"env": env, "base": base, "workers": workers, "port": port, "services": services}
    finally:
        exits = stop_all(list(reversed(services)))
    # Ours end cleanly on SIGTERM (pgbouncer's "fast exit" is 1: not ours to judge).
    ours = {name: code for name, code in exits.items() if not name.startswith("pgbouncer")}
    assert all(code == 0 for code in ours.values()), f"exit statuses after SIGTERM: {exits}; logs in {tmp_path}"


def test_workers_server_and_cli_through_pgbouncer_in_transaction_mode(through_pgbouncer):
    stack = through_pgbouncer
    short = [transitions.create_run(agent="scripted", title=f"short {i}", input={"script": SHORT}) for i in range(4)]
    long = [transitions.create_run(agent="scripted", title=f"long {i}", input={"script": LONG}) for i in range(4)]
    ids = [r.id for r in short + long]

    # claim_next (FOR UPDATE SKIP LOCKED) from two workers at once: each run once.
    with Listening(groups.LIST_GROUP) as viewers:
        wait_until(lambda: Run.objects.filter(pk__in=ids, status="running").count() == 8, 30, "all 8 running")
        claims = RunEvent.objects.filter(run__in=ids, kind=RunEvent.Kind.CLAIMED)
        assert sorted(claims.values_list("run_id", flat=True)) == sorted(ids)  # exactly one claim each
        holders = list(Run.objects.filter(pk__in=ids).values_list("worker", flat=True))
        assert sorted(holders.count(w) for w in stack["workers"]) == [4, 4], holders

        # The long ones stream (deltas to their viewers), then get cancelled: three from
        # the server's operator API, one from the CLI, all through pgbouncer.
        for run in long:
            with Listening(groups.viewers(run.id)) as watching:
                assert watching.wait_for(lambda ms: any(m.get("type") == "run.progress" for m in ms), 20), run.id
        _, operator = create_key("ops", "operator")
        with httpx.Client(base_url=stack["base"] + "/api/v1", headers={"Authorization": f"Bearer {operator}"}) as api:
            for run in long[:3]:
                answer = api.post(f"/runs/{run.id}/cancel", json={"note": "through pgbouncer"})
                assert answer.status_code == 200 and answer.json()["outcome"] == "requested", answer.text
        cli = subprocess.run([sys.executable, "manage.py", "runs", "cancel", str(long[3].id), "--note", "cli"],
                             cwd=ROOT, env=stack["env"], capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr

        wait_until(lambda: not Run.objects.filter(pk__in=ids, status__in=Run.NON_TERMINAL).exists(), 30, "all settled")
        settled = {str(i) for i in ids}
        assert viewers.wait_for(lambda ms: {m["run_id"] for m in ms if m.get("event") == "settled"} >= settled, 10)

    for run in Run.objects.filter(pk__in=[r.id for r in short]):
        assert (run.status, run.termination_reason, run.steps) == ("completed", "completed", 3)
        assert Step.objects.filter(run=run).count() == 3
    for run in Run.objects.filter(pk__in=[r.id for r in long]):
        assert (run.status, run.termination_reason) == ("cancelled", "cancelled")
        assert RunEvent.objects.filter(run=run, kind=RunEvent.Kind.STEP_DISCARDED).exists()
    assert Run.objects.get(pk=long[3].pk).cancel_note == "cli"

    # An external agent's whole lifecycle through the server: create+claim, step, settle.
    _, agent = create_key("ext", "agent")
    with httpx.Client(base_url=stack["base"] + "/api/v1", headers={"Authorization": f"Bearer {agent}"}) as api:
        run = api.post("/runs", json={"agent": "ext-bot", "title": "via pgbouncer", "claim": True}).json()
        step = api.post(f"/runs/{run['id']}/steps", json={"index": 0, "kind": "message", "text": "hello"},
                        headers={"Idempotency-Key": "s0"})
        assert step.status_code in (200, 201), step.text
        settle = api.post(f"/runs/{run['id']}/settle", json={"status": "completed", "reason": "completed"})
        assert settle.status_code == 200, settle.text
    assert Run.objects.filter(pk=run["id"], status="completed", steps=1).exists()

    # The audit trail's CSV export reads with `.iterator()`: a server-side cursor unless
    # they are disabled, and one that outlives its transaction is lost by transaction pooling.
    viewer = User.objects.create_user("viewer")
    viewer.user_permissions.add(Permission.objects.get(content_type__app_label="runs", codename="view_run"))
    browser = Client()
    browser.force_login(viewer)
    export = httpx.get(stack["base"] + "/audit.csv", cookies={"sessionid": browser.cookies["sessionid"].value})
    assert export.status_code == 200, export.text[:500]
    assert export.text.count("through pgbouncer") == 3 and "cli" in export.text, export.text[:500]

    # And it all went through pgbouncer: its own counters say so.
    stats = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(stack["port"]), "-U", connection.settings_dict["USER"], "-At",
         "-F", "|", "-c", "SHOW STATS", "pgbouncer"], capture_output=True, text=True, timeout=30)
    assert stats.returncode == 0, stats.stderr
    rows = {line.split("|")[0]: line.split("|") for line in stats.stdout.splitlines()}
    assert int(rows[connection.settings_dict["NAME"]][1]) > 100, stats.stdout  # total_xact_count
