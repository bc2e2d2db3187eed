"""Browser-compatible control-socket auth: a one-use, short-lived, single-run ticket,
tried with a client that sends no headers at all (as a browser's WebSocket), against
a real daphne."""

import json
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from runs.api import inflight
from runs.api.auth import create_key
from runs.models import ApiTicket

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(live_server_url):
    _, key = create_key("browser", agents=["ext"])
    with httpx.Client(base_url=f"{live_server_url}/api/v1", headers={"Authorization": f"Bearer {key}"},
                      timeout=10) as client:
        client.ws = live_server_url.replace("http", "ws", 1)
        client.run_id = client.post("/runs", json={"agent": "ext", "claim": True}).json()["id"]
        yield client


def refused(url, **kwargs):
    with connect(url, open_timeout=10, **kwargs) as socket:
        message = json.loads(socket.recv(timeout=10))
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=10)
    return message, closed.value.rcvd.code


def test_a_ticket_opens_the_socket_once(api):
    ticket = api.post(f"/runs/{api.run_id}/ticket")
    assert ticket.status_code == 201
    url = api.ws + ticket.json()["url"]
    with connect(url, open_timeout=10) as socket:  # no Authorization, no Origin
        assert json.loads(socket.recv(timeout=10))["type"] == "ready"
    message, code = refused(url)
    assert (message["type"], message["error"]["code"], code) == ("error", "bad_ticket", 4401)


def test_a_ticket_as_a_subprotocol(api):
    ticket = api.post(f"/runs/{api.run_id}/ticket").json()["ticket"]
    with connect(f"{api.ws}/ws/agent/runs/{api.run_id}/", subprotocols=["runwarden", f"ticket.{ticket}"],
                 open_timeout=10) as socket:
        assert socket.subprotocol == "runwarden"
        assert json.loads(socket.recv(timeout=10))["type"] == "ready"


def test_an_expired_or_other_runs_ticket_is_refused(api):
    ticket = api.post(f"/runs/{api.run_id}/ticket").json()["ticket"]
    other_run = api.post("/runs", json={"agent": "ext", "claim": True}).json()["id"]
    message, code = refused(f"{api.ws}/ws/agent/runs/{other_run}/?ticket={ticket}")
    assert (message["error"]["code"], code) == ("bad_ticket", 4401)
    expired = api.post(f"/runs/{api.run_id}/ticket").json()["ticket"]
    ApiTicket.objects.filter(used_at__isnull=True).update(expires_at=timezone.now() - timedelta(seconds=1))
    message, code = refused(f"{api.ws}/ws/agent/runs/{api.run_id}/?ticket={expired}")
    assert (message["error"]["code"], code) == ("bad_ticket", 4401)


def test_the_key_is_never_taken_from_the_url(api):
    key = api.headers["Authorization"].split()[1]
    message, code = refused(f"{api.ws}/ws/agent/runs/{api.run_id}/?ticket={key}")
    assert code == 4401


def test_in_flight_text_sent_to_one_server_is_readable_by_another_process(api):
    events = [{"type": "delta", "step": 0, "offset": 0, "text": "streamed "},
              {"type": "delta", "step": 0, "offset": 9, "text": "elsewhere"}]
    assert api.post(f"/runs/{api.run_id}/events", json={"events": events}).status_code == 200
    snapshot = inflight.snapshot(api.run_id)  # this process, not the server that took the batch
    assert (snapshot["step"], snapshot["text"], snapshot["resync"]) == (0, "streamed elsewhere", True)
    assert api.post(f"/runs/{api.run_id}/steps", json={"index": 0, "kind": "message", "text": "x"}).status_code == 201
    assert inflight.snapshot(api.run_id) is None  # cleared at the commit
