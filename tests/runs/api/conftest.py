"""Fixtures for the agent API: keys of each kind and a JSON client per key."""

import json

import pytest
from django.test import Client

from runs.api.auth import create_key
from tests.conftest import claim_new_run


class ApiClient:
    """Django's test client speaking JSON to /api/v1 with one key."""

    def __init__(self, token=None):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
        self.client = Client(**headers)

    def get(self, path, **extra):
        return self.client.get(f"/api/v1{path}", **extra)

    def post(self, path, body=None, *, raw=None, idempotency_key=None, **extra):
        if idempotency_key is not None:
            extra["HTTP_IDEMPOTENCY_KEY"] = idempotency_key
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(f"/api/v1{path}", data=data, content_type="application/json", **extra)


@pytest.fixture
def make_key(db):
    def make(name, scope="agent"):
        record, token = create_key(name, scope)
        return record, token

    return make


@pytest.fixture
def agent(make_key):
    """(ApiKey, ApiClient) of the agent key `bot`."""
    record, token = make_key("bot")
    return record, ApiClient(token)


@pytest.fixture
def other_agent(make_key):
    record, token = make_key("other-bot")
    return record, ApiClient(token)


@pytest.fixture
def operator(make_key):
    record, token = make_key("ops", "operator")
    return record, ApiClient(token)


@pytest.fixture
def held_run(agent):
    """A run created and claimed through the API by `agent`."""
    _, client = agent

    def make(**body):
        response = client.post("/runs", {"agent": "ext", "claim": True, **body})
        assert response.status_code == 201, response.content
        return response.json()["id"]

    return make


@pytest.fixture
def foreign_run(db):
    """A run held by a built-in worker, not by any API key."""
    return str(claim_new_run(worker="engine-1", title="engine run").id)


def error_code(response):
    body = response.json()
    assert set(body["error"]) == {"code", "message", "fields"}, body
    return body["error"]["code"]


@pytest.fixture(scope="module")
def live_server_url(django_db_setup, django_db_blocker):
    """A real daphne serving dashboard.asgi on the test database, in its own process.

    The channel layer comes from the environment (REDIS_URL), so with Redis the test
    process and the server share it; without it, the server has its own in-memory one."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from django.db import connection, connections

    with django_db_blocker.unblock():
        database = connection.settings_dict
        if connection.vendor == "sqlite":
            url = f"sqlite:///{database['NAME']}"
        else:
            url = f"postgres://{database['USER']}@{database['HOST']}:{database['PORT'] or 5432}/{database['NAME']}"
        connections.close_all()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": url, "DEBUG": "0", "SECRET_KEY": os.environ.get("SECRET_KEY") or "test",
           "ALLOWED_HOSTS": "127.0.0.1,localhost", "RUNWARDEN_EMBEDDED": "0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "dashboard.asgi:application"],
        cwd=Path(__file__).resolve().parents[3], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    for line in server.stderr:  # daphne logs "Listening on TCP address …" once it accepts
        if "Listening on TCP address" in line:
            break
    else:
        raise RuntimeError(f"daphne did not start (exit {server.wait()})")
    # Keep draining its log so a chatty server never blocks on a full pipe.
    import threading

    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=10)
