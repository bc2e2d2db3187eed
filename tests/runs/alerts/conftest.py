"""The documented receiver (docs/alert_receiver.py) as a real process on loopback, and
a capturing server in a thread for the tests that read headers."""

import http.server
import json
import os
import queue
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from runs.alert_records import AlertRule
from runs.alerts import signing

RECEIVER = Path(settings.BASE_DIR) / "docs" / "alert_receiver.py"
SECRET = "s3cret-for-tests"
WAIT_S = 20  # generous: a loaded CI machine


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Receiver:
    """docs/alert_receiver.py running in a subprocess; `received()` is the next delivery
    it accepted: (idempotency key, body as a dict)."""

    def __init__(self, port=0, secret=SECRET):
        self.secret = secret
        self.proc = subprocess.Popen(
            [sys.executable, str(RECEIVER), str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "RUNWARDEN_ALERT_SECRET": secret}, text=True,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        first = self.lines.get(timeout=WAIT_S)
        assert first.startswith("listening "), first
        self.port = int(first.split()[1])
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def received(self, timeout=WAIT_S):
        key, _, body = self.lines.get(timeout=timeout).partition(" ")
        return key, json.loads(body)

    def nothing_more(self):
        """Whether nothing arrived since the last `received()`: a signed sentinel sent now
        must be the very next line (a check of the queue alone could race the pipe)."""
        body = b'{"sentinel":true}'
        answer = httpx.post(self.url, content=body, timeout=WAIT_S, headers={
            "Idempotency-Key": "sentinel", signing.HEADER: signing.sign(self.secret, body)})
        assert answer.status_code == 204
        return self.received() == ("sentinel", {"sentinel": True})

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=WAIT_S)


@pytest.fixture
def receiver():
    started = []

    def start(port=0, secret=SECRET):
        started.append(Receiver(port, secret))
        return started[-1]

    yield start
    for r in started:
        r.stop()


class Capture(http.server.ThreadingHTTPServer):
    """Answers `code` to every POST and keeps (headers, body) of each in `requests`."""

    daemon_threads = True

    def __init__(self, code=200):
        self.code, self.requests = code, queue.Queue()
        super().__init__(("127.0.0.1", 0), CaptureHandler)
        self.url = f"http://127.0.0.1:{self.server_port}/hook"


class CaptureHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.requests.put((dict(self.headers), body))
        self.send_response(self.server.code)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def capture():
    servers = []

    def start(code=200):
        server = Capture(code)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def rule(db):
    """`rule(on, url, **fields)`: an enabled alert rule signed with SECRET."""

    def make(on, url="http://127.0.0.1:9/hook", name=None, **fields):
        fields.setdefault("secret", SECRET)
        return AlertRule.objects.create(name=name or f"{on.replace('_', '-')}-{AlertRule.objects.count()}",
                                        on=on, url=url, **fields)

    return make
