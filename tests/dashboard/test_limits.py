"""A huge anonymous POST is refused with 413 before the server reads it, by a real
daphne (which would otherwise take the whole body in before the application runs)."""

import select
import socket

import pytest

from dashboard.limits import BodyLimit
from tests import servers

LIMIT = 64 * 1024
GIB = 1024 ** 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("limits")
    env = servers.environment(tmp_path, RUNWARDEN_MAX_BODY_BYTES=str(LIMIT))
    servers.migrated_sqlite(tmp_path, env)
    server = servers.Server(env, tmp_path)
    with server.client() as client:  # started, and answering
        assert client.get("/accounts/login/").status_code == 200
    yield server
    server.stop()


def read_answer(sock, timeout=30):
    """Everything the server sends until it closes its side."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def test_content_length_over_the_limit_is_413_without_reading_the_body(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/x-www-form-urlencoded\r\n"
                     + f"Content-Length: {GIB}\r\n\r\n".encode() + b"a" * 1024)
        answer = read_answer(sock)
    # The answer and the server's end of the connection came after 1 KiB of the 1 GiB.
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert f"larger than {LIMIT} bytes".encode() in answer


def test_chunked_body_running_past_the_limit_is_cut(server):
    sent = 0
    chunk = b"a" * 16384
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: application/x-www-form-urlencoded\r\n\r\n")
        sock.setblocking(False)
        # Send until the server answers (or stops taking data); never more than 1 GiB.
        while sent < GIB:
            readable, writable, _ = select.select([sock], [sock], [], 30)
            if readable or not writable:
                break
            try:
                sent += sock.send(frame)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    # Cut near the limit: what was sent past it sat in socket buffers, unread.
    assert sent < 64 * 1024 * 1024


def test_api_gets_the_json_error(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {GIB}\r\n\r\n".encode())
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b'{"error": {"code": "too_large"' in answer


def test_a_body_under_the_limit_still_reaches_the_page(server):
    with server.client() as client:
        answer = client.post("/accounts/login/", content=b"username=x&password=y" + b"&pad=" + b"a" * 1000,
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 403  # CSRF: the body went through to Django


# --- the ASGI guard alone (for ASGI servers other than daphne) -------------------------


class App:
    def __init__(self):
        self.received = []

    async def __call__(self, scope, receive, send):
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app, headers, chunks):
    sent = []
    queue = list(chunks)
    asked = {"n": 0}

    async def receive():
        asked["n"] += 1
        return queue.pop(0)

    async def send(message):
        sent.append(message)

    await BodyLimit(app, LIMIT)({"type": "http", "path": "/accounts/login/", "headers": headers}, receive, send)
    return sent, asked["n"]


@pytest.mark.asyncio
async def test_asgi_guard_refuses_a_declared_length_without_receiving():
    app = App()
    sent, asked = await call(app, [(b"content-length", str(GIB).encode())], [])
    assert sent[0]["status"] == 413 and asked == 0 and app.received == []


@pytest.mark.asyncio
async def test_asgi_guard_cuts_a_stream_and_the_application_sees_a_disconnect():
    app = App()
    chunks = [{"type": "http.request", "body": b"a" * 40000, "more_body": True} for _ in range(10)]
    sent, asked = await call(app, [], chunks)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [413]
    assert asked == 2 and app.received[-1] == {"type": "http.disconnect"}
