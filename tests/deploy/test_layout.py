"""deploy/ as an operator runs it: nginx + 2 daphne servers + 2 `run_agents` workers + the
watchdog, on PostgreSQL + Redis, DEBUG=0, every command line taken from the systemd
units and every setting from deploy/runwarden.env.example (only the database, Redis,
paths and secret are this machine's). Then Chromium, through nginx only.

nginx serves the one rendered site file three times: the load-balanced entry (both
servers) and one entry pinned to each server, so the test knows which server a page (and
its WebSocket) came from; each server's access log confirms it. Runs in the browser pass
(it drives Chromium), on that pass's database, which is PostgreSQL when it is reachable.
"""

import gzip
import http.client
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from channels.layers import channel_layers
from django.conf import settings
from playwright.sync_api import expect

from runs import transitions
from runs.api.auth import create_key
from runs.models import Run, RunEvent
from tests.browser.conftest import CHROMIUM
from tests.browser.test_dashboard import assert_not_reloaded, log_in, make_user, mark_page, wait_live
from tests.deploy.conftest import (
    NGINX,
    Nginx,
    Service,
    missing,
    require_postgres,
    run_to_completion,
    stop_all,
    subprocess_database_url,
    unit_commands,
    unit_environment,
)
from tests.runs.agent.test_e2e_worker import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
REQUIRE_BROWSER = os.environ.get("REQUIRE_BROWSER", "0") == "1"
REQUIRE_POSTGRES = os.environ.get("REQUIRE_POSTGRES", "0") == "1"
LISTENING = r"Listening on TCP address 127\.0\.0\.1:(\d+)"
SLOW = 15_000  # ms: what crosses processes (worker → Redis → server → page) on a loaded machine


@pytest.fixture(autouse=True)
def _patient_expectations():
    """Every expectation here crosses processes (and nginx): give each 15 s, not 5 s, then
    put Playwright's default back for whoever runs next in this process."""
    expect.set_options(timeout=SLOW)
    yield
    expect.set_options(timeout=5_000)


class Stack:
    """The running layout: nginx, servers "a" and "b", two workers, the watchdog."""

    def __init__(self, env, logs):
        self.env, self.logs, self.servers, self.others, self.retired = env, logs, {}, [], []
        self.nginx = Nginx(log_dir=logs)

    def start(self):
        # Instance "0": daphne takes a port from the OS and prints it.
        for name in ("a", "b"):
            self.servers[name] = (self._web(f"web-{name}"), None)
        for name in ("1", "2"):
            (argv,) = unit_commands("runwarden-worker@.service", instance=name, env=self.env)
            self.others.append(Service(f"worker-{name}", argv, env=self.env, log_dir=self.logs))
        (argv,) = unit_commands("runwarden-watchdog.service", env=self.env)
        self.others.append(Service("watchdog", argv, env=self.env, log_dir=self.logs))
        for name, (web, _) in self.servers.items():
            self.servers[name] = (web, int(web.wait_for(LISTENING).group(1)))
        for worker in self.others[:2]:
            worker.wait_for(r"worker \S+ ready")
        self.others[2].wait_for(r"sweeping every")
        self.nginx.start(self.sites())
        self.main, self.a, self.b = (f"http://127.0.0.1:{self.nginx.ports[n]}" for n in ("main", "a", "b"))

    def _web(self, name):
        (argv,) = unit_commands("runwarden-web@.service", instance="0", env=self.env)
        return Service(name, argv, env=self.env, log_dir=self.logs)

    def sites(self):
        """The load-balanced entry (both servers) and one entry pinned to each."""
        a, b = (f"127.0.0.1:{self.servers[n][1]}" for n in ("a", "b"))
        return {"main": [a, b], "a": [a], "b": [b]}

    def restart(self, name):
        """A rolling restart of one server: SIGTERM (its exit status is returned), a new
        instance, nginx re-rendered and reloaded with it."""
        old, _ = self.servers[name]
        code = old.stop()
        self.retired.append(old)
        web = self._web(f"web-{name}-{len(self.retired)}")
        self.servers[name] = (web, int(web.wait_for(LISTENING).group(1)))
        self.nginx.reload(self.sites())
        return code

    def which(self, pattern, timeout=15):
        """The name of the server whose log shows `pattern` (its log lines can trail the
        browser's view by a moment), else None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, (web, _) in self.servers.items():
                if web.seen(pattern, 0.05):
                    return name
        return None

    def stop(self):
        services = [self.nginx.service, *[web for web, _ in self.servers.values()], *self.others, *self.retired]
        return stop_all([s for s in services if s is not None])


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    if not Path(CHROMIUM).exists():
        missing(CHROMIUM, "chromium", required=REQUIRE_BROWSER)
    if not Path(NGINX).exists():
        missing("nginx", "nginx", required=REQUIRE_BROWSER)
    require_postgres(REQUIRE_POSTGRES or REQUIRE_BROWSER)
    if not settings.REDIS_URL:
        pytest.fail("needs Redis (REDIS_URL)") if REQUIRE_POSTGRES else pytest.skip("!!! SKIPPING: needs REDIS_URL")

    logs = tmp_path_factory.mktemp("deploy")
    prefix = f"{os.environ.get('RUNWARDEN_CHANNEL_PREFIX', 'rwtest')}_deploy"
    env = unit_environment(
        DATABASE_URL=subprocess_database_url(), REDIS_URL=settings.REDIS_URL, SECRET_KEY="deploy-test-" + "k" * 40,
        ALLOWED_HOSTS="127.0.0.1", RUNWARDEN_CHANNEL_PREFIX=prefix, STATIC_ROOT=str(logs / "static"),
        RUNWARDEN_WORKSPACE=str(logs / "workspace"),
    )
    # This process creates runs, and their broadcasts must reach the servers: the same
    # layer and prefix as theirs.
    saved_layers = settings.CHANNEL_LAYERS
    settings.CHANNEL_LAYERS = {"default": {**saved_layers["default"], "CONFIG": {
        **saved_layers["default"]["CONFIG"], "prefix": prefix}}}
    channel_layers.backends.clear()

    stack = Stack(env, logs)
    try:
        # runwarden-prepare (collectstatic into an empty STATIC_ROOT, migrate) and the
        # instances' ExecStartPre (`migrate --check`), at once: pytest-django has migrated
        # the test database already, so the order systemd keeps changes nothing here.
        oneshots = [c for c in unit_commands("runwarden-prepare.service", env=env)]
        oneshots += sorted({tuple(c) for u in ("runwarden-web@.service", "runwarden-worker@.service")
                            for c in unit_commands(u, "ExecStartPre", instance="0", env=env)})
        run_to_completion([(f"oneshot-{i}", list(argv)) for i, argv in enumerate(oneshots)], env=env, log_dir=logs)
        assert (logs / "static" / "staticfiles.json").exists()
        stack.start()
        yield stack
    finally:
        exits = stack.stop()
        settings.CHANNEL_LAYERS = saved_layers
        channel_layers.backends.clear()
    # What systemd's stop does: SIGTERM, and every process ends cleanly on its own.
    assert all(code == 0 for code in exits.values()), f"exit statuses after SIGTERM: {exits}; logs in {logs}"


def story(words):
    return " ".join(f"word{i}" for i in range(words))


class LongPoll(threading.Thread):
    """An external agent on the control channel's long-poll, through the proxy."""

    def __init__(self, base, run_id, token, wait):
        super().__init__(daemon=True)
        self.base, self.path, self.token = base, f"/api/v1/runs/{run_id}/control?wait={wait}", token
        self.status = self.error = None

    def run(self):
        host, port = self.base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        try:
            conn.request("GET", self.path, headers={"Authorization": f"Bearer {self.token}"})
            self.status = conn.getresponse().status
        except OSError as error:
            self.error = error
        finally:
            conn.close()


def request(base, method, path, body=b"", headers=None, chunked=False):
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_stream_on_one_server_abort_from_the_other_through_nginx(page, context, stack):
    # Meanwhile an external agent waits 30 s on its control long-poll through the proxy:
    # a quiet wait ends 204, not in a proxy timeout (504) or a dropped connection.
    record, token = create_key("deploy-agent", "agent")
    external = transitions.create_run(agent="external-bot", title="an agent elsewhere")
    assert transitions.claim(external.id, worker=record.worker)
    poll = LongPoll(stack.main, external.id, token, wait=30)
    poll.start()

    make_user("op", "view_run", "cancel_run")
    run = transitions.create_run(agent="scripted", title="a long story",
                                 input={"script": [{"say": story(1000), "token_delay_ms": 40}]})
    log_in(page, stack.main, "op")  # the load-balanced entry; the session cookie is per host

    page.goto(f"{stack.a}/runs/{run.id}/")  # served by server A, WebSocket included
    wait_live(page)
    mark_page(page)
    text = page.get_by_test_id("inflight-text")
    expect(text).to_contain_text("word0 word1 word2")
    expect(text).to_contain_text("word12 ")  # it grows in place: streamed, not reloaded
    streamed = len(text.inner_text())

    other = context.new_page()
    other.goto(f"{stack.b}/runs/{run.id}/")  # served by server B
    wait_live(other)
    other.get_by_test_id("abort-button").click()
    other.locator("#abort-dialog input[name=note]").fill("from server B")
    other.get_by_test_id("confirm-abort").click()

    # The worker (either one) hears the cancel, stops, settles; server A tells its page.
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    expect(page.locator("#timeline")).to_contain_text("from server B")
    assert_not_reloaded(page)
    row = Run.objects.get(pk=run.pk)
    assert (row.status, row.termination_reason, row.cancel_note) == ("cancelled", "cancelled", "from server B")
    assert row.worker and RunEvent.objects.filter(run=row, kind="step_discarded").exists()
    assert streamed < len(story(1000))  # it was cut short, mid-stream

    # Each server's own access log: A served the page and its WebSocket, B the abort.
    web_a, web_b = stack.servers["a"][0], stack.servers["b"][0]
    page_line, socket_line = rf'"GET /runs/{run.id}/" 200', rf'"WSCONNECT /ws/runs/{run.id}/"'
    abort_line = rf'"POST /runs/{run.id}/cancel" 202'
    assert web_a.seen(page_line, 15) and web_a.seen(socket_line, 15), web_a.tail()
    assert web_b.seen(abort_line, 15) and not web_a.seen(abort_line, 0), web_b.tail()

    poll.join(60)
    assert (poll.status, poll.error) == (204, None), "the 30 s long-poll did not survive the proxy"


def test_an_oversized_body_is_refused_by_nginx_with_413(stack):
    web_a, web_b = (stack.servers[name][0] for name in ("a", "b"))
    seen = len(web_a.output()), len(web_b.output())
    body = b"x" * (3 * 1024 * 1024)
    status, headers, text = request(stack.main, "POST", "/accounts/login/", body,
                                    {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 413 and b"nginx" in text, (status, text[:200])
    # Without a Content-Length too (chunked): nginx counts as it reads and stops at 2 MiB.
    chunks = (body[i:i + 65536] for i in range(0, len(body), 65536))
    status, _, text = request(stack.main, "POST", "/api/v1/runs", chunks, {"Content-Type": "application/json"},
                              chunked=True)
    assert status == 413 and b"nginx" in text, (status, text[:200])
    # Not one daphne process saw either.
    unseen = web_a.output()[seen[0]:] + web_b.output()[seen[1]:]
    assert "/accounts/login/" not in unseen and "/api/v1/runs" not in unseen, unseen


def test_metrics_is_not_served_through_the_proxy_but_on_each_servers_own_port(stack):
    for path in ("/metrics", "/metrics?x=1", "/%6Detrics", "//metrics"):
        status, _, text = request(stack.main, "GET", path, headers={"X-Forwarded-For": "127.0.0.1"})
        assert status == 404 and b"nginx" in text, (path, status)
    for _, port in stack.servers.values():  # what Prometheus scrapes, from this machine
        status, _, text = request(f"http://127.0.0.1:{port}", "GET", "/metrics")
        assert status == 200 and b"runwarden_" in text, (port, status, text[:200])
    # daphne --proxy-headers (the unit's flag): the address nginx forwards is the one the
    # application judges, so a request the proxy let through would be refused there too.
    _, port = stack.servers["a"]
    status, _, _ = request(f"http://127.0.0.1:{port}", "GET", "/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
    assert status == 403


def test_static_files_pass_through_the_proxy_precompressed(stack):
    manifest = json.loads((Path(stack.env["STATIC_ROOT"]) / "staticfiles.json").read_text())
    hashed = manifest["paths"]["dashboard/live.js"]
    status, headers, body = request(stack.main, "GET", f"/static/{hashed}", headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("Content-Encoding") == "gzip", (status, headers)
    assert gzip.decompress(body) == (Path(stack.env["STATIC_ROOT"]) / hashed).read_bytes()
    assert "immutable" in headers.get("Cache-Control", "")


def test_each_server_answers_healthz_on_its_own_port_and_through_the_proxy(stack):
    for base in [f"http://127.0.0.1:{port}" for _, port in stack.servers.values()] + [stack.main]:
        status, headers, body = request(base, "GET", "/healthz")
        assert (status, body) == (200, b"ok\n"), base


def test_a_rolling_restart_moves_viewers_to_the_other_server_with_no_gap(page, stack):
    make_user("op", "view_run", "cancel_run")
    run = transitions.create_run(agent="scripted", title="through a restart",
                                 input={"script": [{"say": story(1000), "token_delay_ms": 40}]})
    log_in(page, stack.main, "op")
    page.goto(f"{stack.main}/runs/{run.id}/")  # the load-balanced entry
    wait_live(page)
    mark_page(page)
    text = page.get_by_test_id("inflight-text")
    expect(text).to_contain_text("word5 ")

    connected = rf'"WSCONNECT /ws/runs/{run.id}/"'
    holder = stack.which(connected)
    assert stack.restart(holder) == 0  # SIGTERM: daphne closes its sockets and exits cleanly
    at_stop = len(text.inner_text().split())

    # The page reconnects through nginx (to whichever server is up) and resyncs.
    expect(text).to_contain_text(f"word{at_stop + 10} ")
    wait_live(page)
    assert_not_reloaded(page)
    words = text.inner_text().split()
    assert words == [f"word{i}" for i in range(len(words))], "a gap or a duplicate after the reconnect"
    assert stack.which(connected), "no server took the page over"

    # Stop it now, or the workers' SIGTERM at teardown waits out their grace for it.
    transitions.request_cancel(run.id, by="test", source="api", note="done")
    wait_until(lambda: Run.objects.get(pk=run.pk).status == "cancelled", 30, "the run cancelled")
