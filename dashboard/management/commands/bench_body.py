"""Benchmark: what a large anonymous POST to the login page does to a daphne's memory.

Starts a daphne on this checkout (SQLite in a temporary folder), reads its RSS from
/proc, sends a body of --mib MiB, reads the RSS again, and prints one JSON line.
`--limit` is RUNWARDEN_MAX_BODY_BYTES for that server (a limit above the body shows
what an unguarded server does).
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Command(BaseCommand):
    help = "Measure daphne's memory around one large POST (one JSON line)."

    def add_arguments(self, parser):
        parser.add_argument("--mib", type=int, default=1024, help="body size in MiB")
        parser.add_argument("--limit", type=int, default=settings.RUNWARDEN_MAX_BODY_BYTES, help="server's body limit, bytes")

    def handle(self, *args, mib, limit, **options):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "DEBUG": "0", "SECRET_KEY": os.environ.get("SECRET_KEY") or "bench-" + "x" * 50,
                   "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3", "RUNWARDEN_MAX_BODY_BYTES": str(limit),
                   "RUNWARDEN_ENV_FILE": f"{tmp}/none.env"}
            env.pop("REDIS_URL", None)
            subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=settings.BASE_DIR, env=env,
                           check=True, capture_output=True)
            listener = socket.create_server(("127.0.0.1", 0))
            port = listener.getsockname()[1]
            daphne = subprocess.Popen([str(Path(sys.executable).with_name("daphne")), "--fd", str(listener.fileno()),
                                       "dashboard.asgi:application"], cwd=settings.BASE_DIR, env=env,
                                      pass_fds=[listener.fileno()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                self._get(port)  # warm: the application is loaded
                before = rss_mib(daphne.pid)
                started = time.monotonic()
                status, sent = self._post(port, mib * 1024 * 1024)
                seconds = time.monotonic() - started
                after = rss_mib(daphne.pid)
            finally:
                daphne.terminate()
                daphne.wait(15)
                listener.close()
        self.stdout.write(json.dumps({
            "bench": "body", "body_mib": mib, "limit_bytes": limit, "status": status,
            "sent_mib": round(sent / 2**20, 1), "rss_before_mib": round(before, 1), "rss_after_mib": round(after, 1),
            "rss_delta_mib": round(after - before, 1), "seconds": round(seconds, 2),
        }))

    def _get(self, port):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            while sock.recv(65536):
                pass

    def _post(self, port, size):
        sent = 0
        chunk = b"a" * (1 << 20)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                         b"Content-Type: application/x-www-form-urlencoded\r\n" + f"Content-Length: {size}\r\n\r\n".encode())
            sock.settimeout(5)
            try:
                while sent < size:
                    sent += sock.send(chunk[: size - sent])
            except (OSError, TimeoutError):
                pass  # the server stopped reading (refused) or closed
            sock.settimeout(120)
            answer = b""
            try:
                while data := sock.recv(65536):
                    answer += data
            except OSError:
                pass
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else None
        return status, sent
