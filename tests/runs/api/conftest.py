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
