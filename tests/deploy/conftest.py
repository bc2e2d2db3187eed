"""The production layout of deploy/, run for real: the units' own command lines as
subprocesses, the environment from deploy/runwarden.env.example, nginx from the rendered
site file, pgbouncer from an ini of its own. Nothing here is a stand-in for them.

Every process logs to a file under the test's tmp folder (named in each failure) and is
stopped with SIGTERM at teardown, as systemd would.
"""

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from django.db import connection

from tests.browser.conftest import CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
ENV_EXAMPLE = DEPLOY / "runwarden.env.example"
# Where the units expect the checkout and its venv; the tests map them onto this checkout.
PROD_ROOT = "/opt/runwarden"
PROD_BIN = PROD_ROOT + "/.venv/bin/"
VENV_BIN = Path(sys.executable).parent
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def missing(program, package, *, required):
    """Skip loudly when a Debian package is not installed, or fail when it must be."""
    message = f"{program} is missing (apt-get install -y {package})"
    if required:
        pytest.fail(f"{message}, and CI requires it", pytrace=False)
    pytest.skip(f"!!! SKIPPING: {message}")


def require_postgres(required):
    if connection.vendor != "postgresql":
        message = "needs PostgreSQL (several processes share the test database): set DATABASE_URL"
        if required:
            pytest.fail(message, pytrace=False)
        pytest.skip(f"!!! SKIPPING: {message}")


def subprocess_database_url():
    """The test database, as the subprocesses reach it (see tests/runs/agent/test_e2e_worker.py)."""
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def free_port():
    """A loopback port the OS just handed out (for programs that cannot listen on 0 and
    say where they are: nginx, pgbouncer)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- the units and the environment file ---------------------------------------------------

def read_env_file(path=ENV_EXAMPLE):
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (comments and blanks skipped)."""
    values = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def unit_values(unit, key):
    """Every value of `key=` in a unit file, in order (ExecStart= may repeat)."""
    return [line.split("=", 1)[1] for line in (UNITS / unit).read_text().splitlines() if line.startswith(key + "=")]


def unit_commands(unit, key="ExecStart", *, instance="", env=None):
    """A unit's command lines, expanded as systemd would (%i, %H, ${VAR} from the
    environment file) and pointed at this checkout's venv instead of /opt/runwarden."""
    env = env or {}
    (workdir,) = unit_values(unit, "WorkingDirectory")
    assert workdir == PROD_ROOT, f"{unit}: WorkingDirectory={workdir}"

    def word(text):
        text = text.replace("%i", instance).replace("%H", socket.gethostname())
        text = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text)
        return str(VENV_BIN / text[len(PROD_BIN):]) if text.startswith(PROD_BIN) else text

    return [[word(w) for w in shlex.split(line)] for line in unit_values(unit, key)]


def unit_environment(**overrides):
    """A clean environment as systemd gives a unit: Environment= lines, then the example
    EnvironmentFile, then what this machine's test needs instead (database, Redis, paths)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    for assignment in unit_values("runwarden-web@.service", "Environment"):
        key, _, value = assignment.partition("=")
        env[key] = value
    env.update(read_env_file())
    env.update(overrides)
    return env


# --- processes ------------------------------------------------------------------------------

class Service:
    """A subprocess whose output (stdout and stderr) is collected line by line, so a test
    waits for what it prints instead of sleeping."""

    def __init__(self, name, argv, *, env, log_dir, cwd=ROOT):
        self.name, self.argv = name, argv
        self.log_path = Path(log_dir) / f"{name}.log"
        self.lines, self.changed, self.signalled, self.finished = [], threading.Condition(), False, False
        self.remove_after = []  # folders of its own (config, pid), removed once it has stopped
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace",
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        with self.log_path.open("w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                with self.changed:
                    self.lines.append(line)
                    self.changed.notify_all()
        self.proc.wait()
        with self.changed:
            self.finished = True  # all of its output is in: no match will come any more
            self.changed.notify_all()

    def output(self):
        with self.changed:
            return "".join(self.lines)

    def wait_for(self, pattern, timeout=60, count=1):
        """The `count`th match of `pattern` in the output; fails if the process exits first."""
        regex = re.compile(pattern)

        def matches():
            return list(regex.finditer("".join(self.lines)))

        with self.changed:
            self.changed.wait_for(lambda: len(matches()) >= count or self.finished, timeout)
            found = matches()
        assert len(found) >= count, (
            f"{self.name} never printed {pattern!r} ({count}x; exit {self.proc.poll()}); log {self.log_path}:\n{self.tail()}"
        )
        return found[count - 1]

    def seen(self, pattern, timeout):
        """Whether `pattern` is in the output within `timeout` seconds (no failure)."""
        regex = re.compile(pattern)
        with self.changed:
            return self.changed.wait_for(lambda: regex.search("".join(self.lines)) or self.finished, timeout) \
                and bool(regex.search("".join(self.lines)))

    def tail(self, lines=40):
        return "".join(self.lines[-lines:])

    def terminate(self):
        # Once: a second SIGTERM could land after the process restored the default
        # handler on its way out (asyncio.run does), and kill it mid-exit.
        if self.proc.poll() is None and not self.signalled:
            self.signalled = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout=30):
        """SIGTERM, as systemd stops a unit; the exit status (killed after `timeout`)."""
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(5)
        for folder in self.remove_after:
            shutil.rmtree(folder, ignore_errors=True)
        return self.proc.returncode


def stop_all(services, timeout=30):
    """SIGTERM to every service at once, then their exit statuses by name."""
    for service in services:
        service.terminate()
    return {service.name: service.stop(timeout) for service in services}


def run_to_completion(commands, *, env, log_dir, timeout=120):
    """Oneshot commands [(name, argv)] (ExecStartPre, runwarden-prepare), run side by
    side: each must exit 0."""
    services = [Service(name, argv, env=env, log_dir=log_dir) for name, argv in commands]
    for service in services:
        try:
            service.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            service.stop()
        service.reader.join(5)
        code = service.proc.returncode
        assert code == 0, f"{shlex.join(service.argv)} exited {code}; log {service.log_path}:\n{service.tail()}"
    return services


# --- nginx ----------------------------------------------------------------------------------

NGINX_MAIN = """\
# Test scaffolding only: what Debian's /etc/nginx/nginx.conf provides, with every path
# under this folder. The site files included below are deploy/render_nginx.py's output.
worker_processes 1;
pid {dir}/nginx.pid;
error_log stderr notice;
events {{ worker_connections 256; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{includes}
}}
"""


class Nginx:
    """Debian's nginx in the foreground, every path under a folder of its own, serving
    sites ({name: [upstream address, ...]}), each rendered from the one template
    (deploy/render_nginx.py) on a port of its own that stays across reloads."""

    def __init__(self, *, log_dir):
        sys.path.insert(0, str(DEPLOY))
        try:
            from render_nginx import render
        finally:
            sys.path.remove(str(DEPLOY))
        self.render, self.log_dir, self.ports, self.service = render, log_dir, {}, None
        # Its workers run as `nobody` when the master is root: the prefix must be reachable.
        self.prefix = Path(tempfile.mkdtemp(prefix="runwarden-nginx-"))
        self.prefix.chmod(0o755)
        self.conf = self.prefix / "nginx.conf"

    def _write(self, sites):
        includes = []
        for name, upstreams in sites.items():
            self.ports.setdefault(name, free_port())
            site = self.prefix / f"site-{name}.conf"
            site.write_text(self.render(listen=f"127.0.0.1:{self.ports[name]}", upstreams=upstreams,
                                        upstream=f"runwarden_{name}", server_name="_"))
            includes.append(f"    include {site};")
        self.conf.write_text(NGINX_MAIN.format(dir=self.prefix, includes="\n".join(includes)))
        check = self._nginx("-t")
        assert check.returncode == 0, f"nginx -t refused the rendered configuration:\n{check.stderr}"

    def _nginx(self, *args):
        return subprocess.run([NGINX, "-p", str(self.prefix), "-c", str(self.conf), *args],
                              capture_output=True, text=True, timeout=30)

    def start(self, sites, attempts=3):
        for attempt in range(attempts):
            self.ports = {}
            self._write(sites)
            self.service = Service(f"nginx-{attempt}", [NGINX, "-p", str(self.prefix), "-c", str(self.conf),
                                                        "-g", "daemon off;"],
                                   env={"PATH": os.environ.get("PATH", "")}, log_dir=self.log_dir)
            match = self.service.wait_for(r"start worker process \d+|Address already in use|\[emerg\]", timeout=30)
            if "start worker process" in match.group(0):
                self.service.remove_after.append(self.prefix)
                return self.service
            self.service.stop()
            if "Address already in use" not in match.group(0) or attempt == attempts - 1:
                raise AssertionError(f"nginx did not start:\n{self.service.tail()}")
        raise AssertionError("unreachable")

    def reload(self, sites):
        """Re-render for new upstreams and `nginx -s reload`, as an operator does; returns
        once new workers (with the new configuration) have started."""
        started = len(re.findall(r"start worker process", self.service.output()))
        self._write(sites)
        result = self._nginx("-s", "reload")
        assert result.returncode == 0, result.stderr
        self.service.wait_for("start worker process", count=started + 1)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    from tests.browser.conftest import CHROMIUM

    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


# --- pgbouncer ------------------------------------------------------------------------------

PGBOUNCER_INI = """\
[databases]
{name} = host={host} port={port} dbname={name}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/userlist.txt
admin_users = {user}
pool_mode = transaction
; Fewer server connections than clients: transactions really are multiplexed.
default_pool_size = {pool}
max_client_conn = 200
; Hand out server connections in turn (not the most recently used first): two
; transactions of one client then land on different servers, as they do under load, so
; session state that leaks between transactions fails here every time, not by luck.
server_round_robin = 1
"""


def start_pgbouncer(*, log_dir, pool_size=4, attempts=3):
    """Debian's pgbouncer in front of the test database, transaction pooling; returns
    (Service, port). It refuses to run as root, so then it runs as `nobody`."""
    db = connection.settings_dict
    folder = Path(tempfile.mkdtemp(prefix="runwarden-pgbouncer-"))
    folder.chmod(0o755)  # readable by `nobody`
    users = folder / "userlist.txt"
    users.write_text(f'"{db["USER"]}" ""\n')
    users.chmod(0o644)
    as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
    for attempt in range(attempts):
        port = free_port()
        ini = folder / "pgbouncer.ini"
        ini.write_text(PGBOUNCER_INI.format(name=db["NAME"], host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432,
                                            listen=port, dir=folder, user=db["USER"], pool=pool_size))
        ini.chmod(0o644)
        service = Service(f"pgbouncer-{attempt}", [PGBOUNCER, *as_user, str(ini)],
                          env={"PATH": os.environ.get("PATH", "")}, log_dir=log_dir)
        match = service.wait_for(r"process up|Address already in use|FATAL|ERROR", timeout=30)
        if "process up" in match.group(0):
            service.remove_after.append(folder)
            return service, port
        service.stop()
        if "Address already in use" not in match.group(0) or attempt == attempts - 1:
            raise AssertionError(f"pgbouncer did not start:\n{service.tail()}")
    raise AssertionError("unreachable")
