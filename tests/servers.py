"""Real daphne servers in subprocesses, for tests that need the whole stack: the ASGI
guards, the logging daphne configures, settings read from an environment.

The listening socket is made here and handed to daphne (`--fd`), so the address is
known before the server starts and no port is guessed; a request sent before daphne
is ready waits in the socket's backlog instead of failing.
"""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx

BASE_DIR = Path(__file__).resolve().parents[1]
DAPHNE = str(Path(sys.executable).with_name("daphne"))


def environment(tmp_path, **overrides):
    """The test process's environment as a server would get it: no PostgreSQL/Redis
    unless asked, a settings file that does not exist, DEBUG=0, a SQLite file."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env.update({
        "DEBUG": "0",
        "SECRET_KEY": "runwarden-test-secret-key-that-is-long-enough-for-check-deploy-0123456789",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'server.sqlite3'}",
        "RUNWARDEN_ENV_FILE": str(tmp_path / "no-such.env"),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(overrides)
    return env


def manage(env, *args, input=None, check=True):
    done = subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], env=env, cwd=BASE_DIR,
                          input=input, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done


_migrated = {}


def migrated_sqlite(tmp_path, env):
    """Copy a migrated SQLite database (made once per test session) to env's DATABASE_URL."""
    target = Path(env["DATABASE_URL"].removeprefix("sqlite:///"))
    if "template" not in _migrated:
        template = Path(os.environ.get("TMPDIR", "/tmp")) / f"rw-migrated-{os.getpid()}.sqlite3"
        template.unlink(missing_ok=True)
        manage({**env, "DATABASE_URL": f"sqlite:///{template}"}, "migrate", "--noinput")
        _migrated["template"] = template
    shutil.copyfile(_migrated["template"], target)
    return target


class Server:
    def __init__(self, env, tmp_path, *, name="daphne"):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # stderr: the log (Python logging); stdout: daphne's access log, a stream of its own.
        self.log_path = tmp_path / f"{name}.log"
        self.access_log_path = tmp_path / f"{name}.access.log"
        self._log = open(self.log_path, "wb")
        self._access_log = open(self.access_log_path, "wb")
        self.process = subprocess.Popen(
            [DAPHNE, "--fd", str(self.sock.fileno()), "dashboard.asgi:application"],
            env=env, cwd=BASE_DIR, stdout=self._access_log, stderr=self._log, pass_fds=[self.sock.fileno()],
        )

    def client(self, **kwargs):
        kwargs.setdefault("timeout", 60)
        return httpx.Client(base_url=self.url, **kwargs)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.sock.close()
        self._log.close()
        self._access_log.close()
