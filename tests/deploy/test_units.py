"""The deploy/ files agree with the application and with each other (no processes: the
browser pass's test_layout.py runs them). What each check guards is in its name."""

import re
import subprocess
import sys

import pytest
from django.conf import settings

from runs.api.control import MAX_WAIT_S
from runs.api.parsing import MAX_BODY_BYTES
from tests.deploy.conftest import DEPLOY, ENV_EXAMPLE, UNITS, read_env_file, unit_values

sys.path.insert(0, str(DEPLOY))
from render_nginx import render  # noqa: E402

sys.path.remove(str(DEPLOY))
LONG_RUNNING = ["runwarden-web@.service", "runwarden-worker@.service", "runwarden-watchdog.service"]
SIZES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def seconds(value):
    match = re.fullmatch(r"(\d+)(s|m|h)?", value)
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]


def nginx_directive(text, name):
    return re.findall(rf"^\s*{name}\s+([^;]+);", text, flags=re.M)


def site():
    return render(listen="80", upstreams=["127.0.0.1:8001", "127.0.0.1:8002"])


@pytest.mark.parametrize("unit", LONG_RUNNING)
def test_long_running_units_stop_on_sigterm_and_restart_on_failure(unit):
    assert unit_values(unit, "KillSignal") == ["SIGTERM"]
    assert unit_values(unit, "Restart") == ["on-failure"]
    assert unit_values(unit, "EnvironmentFile") == ["/etc/runwarden/runwarden.env"]
    assert unit_values(unit, "User") == ["runwarden"]


def test_the_worker_outlasts_its_shutdown_grace_before_systemd_kills_it():
    (stop,) = unit_values("runwarden-worker@.service", "TimeoutStopSec")
    grace = float(read_env_file(ENV_EXAMPLE)["RUNWARDEN_SHUTDOWN_GRACE_S"])
    assert grace == settings.RUNWARDEN_SHUTDOWN_GRACE_S  # the example documents the default
    assert seconds(stop) >= grace + 10, "the runs' settles need time after the grace, or SIGKILL leaves them to the reaper"


def test_only_the_prepare_unit_migrates_the_instances_only_check():
    prepare = unit_values("runwarden-prepare.service", "ExecStart")
    assert any(" migrate --noinput" in line for line in prepare)
    assert any(" collectstatic --noinput" in line for line in prepare)
    for unit in ("runwarden-web@.service", "runwarden-worker@.service"):
        for line in unit_values(unit, "ExecStartPre") + unit_values(unit, "ExecStart"):
            assert " migrate" not in line or "migrate --check" in line, (unit, line)
            assert "collectstatic" not in line, (unit, line)


def test_every_unit_in_deploy_is_wanted_by_the_target():
    for unit in sorted(UNITS.glob("*.service")):
        assert unit_values(unit.name, "WantedBy") == ["runwarden.target"], unit.name
        assert unit_values(unit.name, "PartOf") == ["runwarden.target"], unit.name


def test_the_proxy_waits_longer_than_the_longest_long_poll():
    text = site()
    assert all(seconds(v) > MAX_WAIT_S for v in nginx_directive(text, "proxy_read_timeout")), text
    assert all(seconds(v) > MAX_WAIT_S for v in nginx_directive(text, "proxy_send_timeout"))


def test_the_proxy_body_limit_admits_the_apis_largest_batch():
    (limit,) = nginx_directive(site(), "client_max_body_size")
    size = int(limit[:-1]) * SIZES[limit[-1].lower()]
    assert MAX_BODY_BYTES < size <= 8 * MAX_BODY_BYTES


def test_rendering_fills_every_placeholder_and_names_both_upstreams():
    text = site()
    assert "${" not in text
    assert "server 127.0.0.1:8001;" in text and "server 127.0.0.1:8002;" in text
    assert "listen 80;" in text


@pytest.mark.parametrize("kwargs, message", [
    ({"upstreams": []}, "at least one --upstream"),
    ({"upstreams": ["8001"]}, "is not HOST:PORT"),
    ({"upstreams": ["127.0.0.1:8001; evil"]}, "is not HOST:PORT"),
    ({"upstreams": ["127.0.0.1:8001"], "upstream": "Bad-Name"}, "--upstream-name"),
    ({"upstreams": ["127.0.0.1:8001"], "listen": "80; include /etc/passwd"}, "--listen"),
    ({"upstreams": ["127.0.0.1:8001\n"]}, "is not HOST:PORT"),
    ({"upstreams": ["127.0.0.1:8001"], "server_name": "a;} server {"}, "--server-name"),
])
def test_bad_render_arguments_are_refused_with_the_argument_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        render(**{"listen": "80", **kwargs})


def test_a_placeholder_without_a_value_is_an_error_not_an_empty_string(tmp_path):
    template = tmp_path / "t.conf"
    template.write_text("listen ${LISTEN}; root ${NOT_KNOWN};\n")
    with pytest.raises(ValueError, match=r"no value for \$\{NOT_KNOWN\}"):
        render(listen="80", upstreams=["127.0.0.1:1"], template=template)


def test_the_renderer_command_line_says_what_is_wrong_in_one_line():
    result = subprocess.run([sys.executable, str(DEPLOY / "render_nginx.py"), "--upstream", "nope"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["render_nginx: --upstream 'nope' is not HOST:PORT or unix:/PATH"]
