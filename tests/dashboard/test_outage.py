"""A database outage answers 503 (HTML for people, the API's JSON error for the API and
/metrics, Retry-After), never 500, and a real daphne recovers by itself.

A `tests.faults.TcpProxy` sits between daphne and PostgreSQL: `cut()` resets every
connection and every new one, `restore()` forwards again.
"""

import re
import socket
import uuid

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client

from tests import servers
from tests.faults import TcpProxy

KEY = "Bearer rw_" + "x" * 43  # well-formed, unknown: looked up in the database
RUN = f"/api/v1/runs/{uuid.UUID(int=7)}"


def session_cookie(user):
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def answers(server, session):
    """(status, body, Retry-After) of a page, the API and /metrics."""
    result = {}
    with server.client() as client:
        for name, path, headers in (
            ("page", "/", {"Cookie": f"sessionid={session}"}),
            ("api", RUN, {"Authorization": KEY}),
            ("metrics", "/metrics", {}),
        ):
            answer = client.get(path, headers=headers)
            result[name] = (answer.status_code, answer.text, answer.headers.get("retry-after"))
    return result


def assert_unavailable(result):
    status, html, retry = result["page"]
    assert status == 503 and retry == "5", result["page"]
    assert "The database is unavailable" in html
    for name in ("api", "metrics"):
        status, body, retry = result[name]
        assert status == 503 and retry == "5", result[name]
        assert '"code": "database_unavailable"' in body


def assert_working(result):
    assert result["page"][0] == 200, result["page"]
    assert result["api"][0] == 401, result["api"]  # the key lookup ran
    assert result["metrics"][0] == 200, result["metrics"]


def test_closed_port_answers_503_everywhere(tmp_path):
    """No PostgreSQL at all (a closed port): every kind of answer is a 503, on any pass."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    env = servers.environment(tmp_path, DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/nowhere",
                              RUNWARDEN_DB_POOL_TIMEOUT_S="1")
    server = servers.Server(env, tmp_path)
    try:
        assert_unavailable(answers(server, "no-such-session"))
        with server.client() as client:  # a login attempt too (axes and auth read the database)
            assert client.post("/accounts/login/", data={"username": "a"}).status_code in (403, 503)
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log, log
    assert len(re.findall("database unavailable", log)) == 1, log


@pytest.mark.parametrize("pool", ["1", "0"], ids=["pool", "no-pool"])
def test_outage_is_503_and_the_server_recovers_by_itself(postgres, tmp_path, pool):
    user = User.objects.create_user("ada", password="pw-ada")
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="runs", codename="view_run"))
    session = session_cookie(user)
    settings_dict = connection.settings_dict
    proxy = TcpProxy(int(settings_dict["PORT"] or 5432), settings_dict["HOST"] or "127.0.0.1").start()
    url = f"postgres://{settings_dict['USER']}@127.0.0.1:{proxy.port}/{settings_dict['NAME']}"
    env = servers.environment(tmp_path, DATABASE_URL=url, RUNWARDEN_DB_POOL=pool, RUNWARDEN_DB_POOL_TIMEOUT_S="2",
                              SECRET_KEY=django_settings.SECRET_KEY)  # the session was signed here
    server = servers.Server(env, tmp_path)
    try:
        assert_working(answers(server, session))
        proxy.cut()
        for _ in range(3):
            assert_unavailable(answers(server, session))
        proxy.restore()
        # The very first requests after: no stale pooled connection, no restart.
        for _ in range(3):
            assert_working(answers(server, session))
    finally:
        server.stop()
        proxy.stop()
    log = server.log()
    assert "Traceback" not in log, log
    assert len(re.findall("database unavailable", log)) == 1, log
    back = re.findall(r"database is back after [\d.]+ s; (\d+) requests answered 503", log)
    assert back == ["9"], log
