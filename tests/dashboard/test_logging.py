"""Logs under a real daphne: every line once, refusals in one line without a traceback,
JSON on request."""

import json

import pytest
import websockets
from websockets.sync.client import connect as ws_connect

from tests import servers


def refusals(server):
    """A 404, a foreign Host, a CSRF failure and a refused WebSocket."""
    with server.client() as client:
        assert client.get("/no-such-page").status_code == 404
        assert client.get("/accounts/login/", headers={"Host": "evil.example"}).status_code == 400
        assert client.post("/accounts/login/", data={"username": "x"}).status_code == 403
    with pytest.raises(websockets.exceptions.InvalidStatus):
        with ws_connect(f"ws://127.0.0.1:{server.port}/ws/runs/", origin="http://evil.example", open_timeout=30):
            pass
    with server.client() as client:  # the log is written before this answer
        assert client.get("/accounts/login/").status_code == 200


@pytest.fixture
def serve(tmp_path):
    started = []

    def serve(**env):
        env = servers.environment(tmp_path, **env)
        servers.migrated_sqlite(tmp_path, env)
        server = servers.Server(env, tmp_path)
        started.append(server)
        return server

    yield serve
    for server in started:
        server.stop()


def stop_and_read(server):
    server.stop()  # flushes and closes the log
    return [line for line in server.log().splitlines() if line.strip()]


def test_every_line_once_and_refusals_without_traceback(serve):
    server = serve()
    refusals(server)
    lines = stop_and_read(server)
    text = "\n".join(lines)
    assert "Traceback" not in text, text
    assert len(lines) == len(set(lines)), text  # nothing printed twice
    assert sum("Not Found: /no-such-page" in line for line in lines) == 1, text
    assert sum("Invalid HTTP_HOST header: 'evil.example'" in line for line in lines) == 1, text
    assert sum("Forbidden (CSRF cookie not set.): /accounts/login/" in line for line in lines) == 1, text
    disallowed = next(line for line in lines if "Invalid HTTP_HOST" in line)
    assert " WARNING django.security.DisallowedHost " in disallowed


def test_json_format_is_one_object_per_line(serve):
    server = serve(RUNWARDEN_LOG_FORMAT="json")
    refusals(server)
    lines = stop_and_read(server)
    records = [json.loads(line) for line in lines]  # every line, daphne's own included
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any(r["logger"] == "django.request" and r["message"] == "Not Found: /no-such-page" for r in records)
    assert any(r["logger"].startswith("daphne") for r in records)


@pytest.mark.parametrize("debug", ["0", "1"])
def test_a_runs_line_is_printed_once_after_daphnes_basic_config(tmp_path, debug):
    """daphne calls logging.basicConfig before loading the application; the project's
    loggers must not add a handler of their own on top of the root's."""
    import subprocess
    import sys

    code = ("import logging; logging.basicConfig(level=logging.INFO); import django; django.setup(); "
            "logging.getLogger('runs.agent').warning('said once'); logging.getLogger('django.request').warning('django once')")
    env = servers.environment(tmp_path, DEBUG=debug, DJANGO_SETTINGS_MODULE="dashboard.settings")
    done = subprocess.run([sys.executable, "-c", code], cwd=servers.BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("said once") == 1, done.stderr
    assert done.stderr.count("django once") == 1, done.stderr


def test_a_redis_outage_is_one_line_down_and_one_line_back_without_tracebacks(tmp_path):
    """Redis cut under a live server: the layer's receive task and every socket that
    tries to (re)connect fail, each caught and logged somewhere; the log says it once."""
    import os

    import httpx

    from tests.faults import TcpProxy

    redis_port = int(os.environ.get("TEST_REDIS_PORT", "6379"))
    with TcpProxy(redis_port).start() as proxy:
        env = servers.environment(tmp_path, REDIS_URL=f"redis://127.0.0.1:{proxy.port}/0",
                                  RUNWARDEN_CHANNEL_PREFIX=f"rw_logtest_{os.getpid()}")
        servers.migrated_sqlite(tmp_path, env)
        servers.manage(env, "runwarden_user", "create", "ada", "--role", "viewer", "--password-stdin", input="pw-ada-123\n")
        server = servers.Server(env, tmp_path)
        try:
            with server.client(follow_redirects=False) as client:
                client.get("/accounts/login/")
                token = client.cookies["csrftoken"]
                assert client.post("/accounts/login/", data={"username": "ada", "password": "pw-ada-123",
                                                             "csrfmiddlewaretoken": token}).status_code == 302
                cookie = f"sessionid={client.cookies['sessionid']}"

            def watch():
                return ws_connect(f"ws://127.0.0.1:{server.port}/ws/runs/", origin=f"http://127.0.0.1:{server.port}",
                                  additional_headers={"Cookie": cookie}, open_timeout=30)

            with watch():  # accepted: joined its group on Redis
                pass
            proxy.cut()
            refused = 0
            for _ in range(5):  # a browser reconnecting: each attempt fails on the layer
                try:
                    with watch():
                        pass
                except (websockets.exceptions.WebSocketException, OSError, TimeoutError):
                    refused += 1
            assert refused == 5
            proxy.restore()
            with watch():  # back: the first socket that joins says so
                pass
            with server.client() as client:  # the log is written before this answer
                assert client.get("/healthz").status_code == 200
        finally:
            server.stop()
    text = server.log()
    assert "Traceback" not in text, text
    assert text.count("channel layer (Redis) unavailable") == 1, text
    assert text.count("channel layer (Redis) answering again") == 1, text
