"""A wrong setting fails at start with one line naming the variable."""

import os
import subprocess
import sys

import pytest
from django.conf import settings

CASES = [
    ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
    ({"DEBUG": "0", "SECRET_KEY": ""}, "SECRET_KEY is required unless DEBUG=1"),
    ({"DATABASE_URL": "mysql://db/x"}, "DATABASE_URL='mysql://db/x' has scheme 'mysql'"),
    ({"REDIS_URL": "http://cache"}, "REDIS_URL='http://cache' has scheme 'http'"),
    ({"ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS is empty"),
    ({"RUNWARDEN_HEARTBEAT_S": "fast"}, "RUNWARDEN_HEARTBEAT_S='fast' is not a number"),
    ({"RUNWARDEN_HEARTBEAT_S": "0"}, "RUNWARDEN_HEARTBEAT_S='0' must be at least 0.05"),
]


@pytest.mark.parametrize("overrides,expected", CASES)
def test_wrong_setting_is_one_line_naming_the_variable(overrides, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"SECRET_KEY": "x", **overrides})
    done = subprocess.run(
        [sys.executable, str(settings.BASE_DIR / "manage.py"), "check"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("runwarden: configuration error: ") and expected in lines[0]


def test_server_without_collected_static_refuses_to_start_in_one_line(tmp_path):
    """With DEBUG=0 every page links to hashed files; a server without them would serve
    a dashboard with no JavaScript, so it stops at start and says what to run."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"SECRET_KEY": "x", "DEBUG": "0", "STATIC_ROOT": str(tmp_path / "empty")})
    done = subprocess.run(
        [sys.executable, "-c", "import dashboard.asgi"],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "static files are not collected" in lines[0] and "collectstatic" in lines[0]
