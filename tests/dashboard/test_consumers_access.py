"""Who may hold a live socket: refusals say why with a close code the page shows (and
does not retry), the Origin must be ours to the port, and a socket ends with its session."""

import logging

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from dashboard import consumers
from dashboard.asgi import application
from runs import transitions
from tests.dashboard.conftest import ORIGIN

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
TIMEOUT = 3
NO_RUN = "/ws/runs/00000000-0000-0000-0000-000000000000/"


@pytest.fixture(autouse=True)
def quiet_heartbeats(monkeypatch):
    monkeypatch.setattr(consumers, "HEARTBEAT_REFRESH_S", 60)


def logged_in(user):
    """A browser's Client and the socket headers (Origin, Host, its session cookie)."""
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    return client, [*ORIGIN, (b"cookie", cookie)]


async def headers_of(user):
    return (await database_sync_to_async(logged_in)(user))[1]


async def close_code(path, headers):
    """The close code of a socket the server accepts and then closes at once."""
    ws = WebsocketCommunicator(application, path, headers=headers)
    ok, code = await ws.connect(timeout=TIMEOUT)
    # Refused before the handshake (a plain HTTP 403), the browser only sees 1006.
    assert ok, f"refused before the handshake ({code}): the page cannot tell why"
    closed = await ws.receive_output(timeout=TIMEOUT)
    assert closed["type"] == "websocket.close"
    return closed.get("code")


async def running_run():
    run = await database_sync_to_async(transitions.create_run)(agent="scripted", title="watched")
    assert await database_sync_to_async(transitions.claim)(run.id, worker="w1")
    return run


# --- refusals with a reason ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/ws/runs/", NO_RUN])
async def test_socket_without_a_session_is_closed_with_4403(path):
    assert await close_code(path, ORIGIN) == 4403


async def test_socket_without_view_permission_is_closed_with_4403(stranger):
    run = await running_run()
    headers = await headers_of(stranger)
    for path in ("/ws/runs/", f"/ws/runs/{run.id}/"):
        assert await close_code(path, headers) == 4403


async def test_socket_for_an_unknown_run_is_closed_with_4404(operator):
    assert await close_code(NO_RUN, await headers_of(operator)) == 4404


@pytest.mark.parametrize("path", ["/ws/nowhere/", "/ws/runs/not-a-uuid/", "/ws/agent/"])
async def test_unknown_path_is_closed_with_4404_and_one_log_line(operator, path, caplog):
    with caplog.at_level(logging.WARNING):
        assert await close_code(path, await headers_of(operator)) == 4404
    lines = [r for r in caplog.records if "no route" in r.getMessage()]
    assert len(lines) == 1 and path in lines[0].getMessage() and lines[0].exc_info is None


# --- the Origin, to the port -----------------------------------------------------------------


async def opens(headers, path="/ws/runs/"):
    ws = WebsocketCommunicator(application, path, headers=headers)
    ok, _code = await ws.connect(timeout=TIMEOUT)
    if ok:
        await ws.disconnect()
    return ok


def with_origin(headers, origin, host=None):
    kept = [h for h in headers if h[0] not in (b"origin", b"host")]
    extra = [(b"origin", origin.encode())] if origin else []
    return [*kept, *extra, (b"host", (host or "127.0.0.1").encode())]


async def test_socket_from_another_port_of_our_host_is_refused(operator):
    headers = await headers_of(operator)
    assert not await opens(with_origin(headers, "http://127.0.0.1:9999", "127.0.0.1:8000"))
    assert not await opens(with_origin(headers, "http://127.0.0.1:9999"))  # Host without a port: 80
    assert await opens(with_origin(headers, "http://127.0.0.1:8000", "127.0.0.1:8000"))


async def test_socket_from_a_foreign_origin_or_none_is_refused(operator):
    headers = await headers_of(operator)
    assert not await opens(with_origin(headers, "http://evil.example"))
    assert not await opens(with_origin(headers, None))
    assert not await opens(with_origin(headers, "https://127.0.0.1"))  # another scheme: port 443


# --- a socket ends with its session -----------------------------------------------------------


async def test_logout_closes_that_sessions_sockets_only(operator):
    run = await running_run()
    client, headers = await database_sync_to_async(logged_in)(operator)
    other_headers = await headers_of(operator)  # the same user in another browser
    mine = [WebsocketCommunicator(application, path, headers=headers) for path in ("/ws/runs/", f"/ws/runs/{run.id}/")]
    theirs = WebsocketCommunicator(application, "/ws/runs/", headers=other_headers)
    for ws in (*mine, theirs):
        assert (await ws.connect(timeout=TIMEOUT))[0]
    assert (await database_sync_to_async(client.post)("/accounts/logout/")).status_code == 302
    for ws in mine:
        closed = await ws.receive_output(timeout=TIMEOUT)
        assert closed["type"] == "websocket.close" and closed["code"] == 4403
    assert await theirs.receive_nothing(timeout=0.3)
    await theirs.disconnect()


async def test_deactivating_a_user_closes_their_sockets(operator):
    headers = await headers_of(operator)
    ws = WebsocketCommunicator(application, "/ws/runs/", headers=headers)
    assert (await ws.connect(timeout=TIMEOUT))[0]

    def deactivate():
        user = User.objects.get(pk=operator.pk)
        user.is_active = False
        user.save()

    await database_sync_to_async(deactivate)()
    closed = await ws.receive_output(timeout=TIMEOUT)
    assert closed["type"] == "websocket.close" and closed["code"] == 4403
