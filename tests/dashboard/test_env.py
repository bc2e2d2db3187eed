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
    ({"CSRF_TRUSTED_ORIGINS": "runwarden.example"}, "CSRF_TRUSTED_ORIGINS: 'runwarden.example' is not an origin"),
    ({"CSRF_TRUSTED_ORIGINS": "https://x.example/path"}, "'https://x.example/path' is not an origin"),
    ({"SECURE_HSTS_SECONDS": "a year"}, "SECURE_HSTS_SECONDS='a year' is not a number"),
    ({"SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"}, "SECURE_PROXY_SSL_HEADER='X-Forwarded-Proto' is not a boolean"),
    ({"SECURE_COOKIES": "sure"}, "SECURE_COOKIES='sure' is not a boolean"),
    ({"RUNWARDEN_LOG_FORMAT": "xml"}, "RUNWARDEN_LOG_FORMAT='xml' is not one of: json, plain"),
    ({"RUNWARDEN_DB_POOL_SIZE": "0"}, "RUNWARDEN_DB_POOL_SIZE='0' must be at least 1"),
    ({"RUNWARDEN_MAX_BODY_BYTES": "lots"}, "RUNWARDEN_MAX_BODY_BYTES='lots' is not a number"),
    ({"RUNWARDEN_LOGIN_FAILURES": "0"}, "RUNWARDEN_LOGIN_FAILURES='0' must be at least 1"),
    ({"RUNWARDEN_TRUSTED_PROXIES": "proxy.local"}, "RUNWARDEN_TRUSTED_PROXIES='proxy.local'"),
    ({"RUNWARDEN_LOOP_REPEAT": "1"}, "RUNWARDEN_LOOP_REPEAT='1' must be at least 2"),
    ({"RUNWARDEN_LOOP_FAILURES": "some"}, "RUNWARDEN_LOOP_FAILURES='some' is not a number"),
    ({"RUNWARDEN_NO_PROGRESS_S": "0"}, "RUNWARDEN_NO_PROGRESS_S='0' must be at least 1"),
]


@pytest.mark.parametrize("overrides,expected", CASES)
def test_wrong_setting_is_one_line_naming_the_variable(overrides, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"SECRET_KEY": "x", "RUNWARDEN_ENV_FILE": "/nonexistent/runwarden.env", **overrides})
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


def settings_of(tmp_path, names, **overrides):
    """Settings as a fresh process computes them from `overrides` (and no settings file)."""
    import json

    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "RUNWARDEN_CHANNEL_PREFIX", "DEBUG", "SECRET_KEY")}
    env.update({"RUNWARDEN_ENV_FILE": str(tmp_path / "none.env"), "DJANGO_SETTINGS_MODULE": "dashboard.settings",
                **overrides})
    code = f"import json; from django.conf import settings; print(json.dumps({{n: str(getattr(settings, n)) for n in {names!r}}}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def prefix_of(tmp_path, **overrides):
    return settings_of(tmp_path, ["RUNWARDEN_CHANNEL_PREFIX"], DEBUG="1", **overrides)["RUNWARDEN_CHANNEL_PREFIX"]


def test_channel_prefix_is_derived_from_the_database(tmp_path):
    """Two deployments on one Redis (pub/sub ignores the DB number) hear each other
    unless their prefixes differ; every process of one deployment must agree."""
    a = prefix_of(tmp_path, DATABASE_URL="postgres://rw@db1.internal:5432/runwarden")
    again = prefix_of(tmp_path, DATABASE_URL="postgres://other-user:pw@db1.internal:5432/runwarden")
    other_name = prefix_of(tmp_path, DATABASE_URL="postgres://rw@db1.internal:5432/runwarden_staging")
    other_host = prefix_of(tmp_path, DATABASE_URL="postgres://rw@db2.internal:5432/runwarden")
    other_port = prefix_of(tmp_path, DATABASE_URL="postgres://rw@db1.internal:6432/runwarden")
    assert a.startswith("rw_") and a == again  # user and password do not name a deployment
    assert len({a, other_name, other_host, other_port}) == 4


def test_channel_prefix_from_the_environment_wins(tmp_path):
    assert prefix_of(tmp_path, RUNWARDEN_CHANNEL_PREFIX="blue") == "blue"


def test_postgres_gets_a_bounded_pool_and_pgbouncer_turns_it_off(tmp_path):
    import ast

    url = {"DATABASE_URL": "postgres://rw@db.internal:5432/runwarden", "DEBUG": "1", "RUNWARDEN_DB_POOL": "1"}
    default = ast.literal_eval(settings_of(tmp_path, ["DATABASES"], **url)["DATABASES"])["default"]
    assert default["OPTIONS"]["pool"] == {"min_size": 1, "max_size": 4, "timeout": 5.0, "reconnect_timeout": 5.0}
    assert default["CONN_HEALTH_CHECKS"] is True and default["CONN_MAX_AGE"] == 0
    sized = ast.literal_eval(settings_of(tmp_path, ["DATABASES"], RUNWARDEN_DB_POOL_SIZE="7",
                                         RUNWARDEN_DB_POOL_TIMEOUT_S="3", **url)["DATABASES"])["default"]
    assert sized["OPTIONS"]["pool"]["max_size"] == 7 and sized["OPTIONS"]["pool"]["timeout"] == 3.0
    bouncer = ast.literal_eval(settings_of(tmp_path, ["DATABASES"], RUNWARDEN_PGBOUNCER="1", **url)["DATABASES"])["default"]
    assert "pool" not in bouncer["OPTIONS"] and bouncer["DISABLE_SERVER_SIDE_CURSORS"] is True
    # manage.py processes (workers) connect directly unless asked: servers turn it on.
    direct = ast.literal_eval(settings_of(tmp_path, ["DATABASES"], **{**url, "RUNWARDEN_DB_POOL": "0"})["DATABASES"])
    assert "pool" not in direct["default"]["OPTIONS"]


def test_the_server_entry_point_turns_the_pool_on(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "RUNWARDEN_DB_POOL")}
    env.update({"DATABASE_URL": "postgres://rw@db.internal:5432/runwarden", "SECRET_KEY": "x", "DEBUG": "0",
                "RUNWARDEN_ENV_FILE": str(tmp_path / "none.env")})
    code = "import dashboard.asgi; from django.conf import settings; print(settings.DATABASES['default']['OPTIONS'].get('pool'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "'max_size': 4" in done.stdout


PROXY_SETTINGS = ["CSRF_TRUSTED_ORIGINS", "SECURE_PROXY_SSL_HEADER", "USE_X_FORWARDED_HOST", "SESSION_COOKIE_SECURE",
                  "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS"]


def test_proxy_and_tls_settings_are_off_unless_asked(tmp_path):
    off = settings_of(tmp_path, [n for n in PROXY_SETTINGS if n != "SECURE_PROXY_SSL_HEADER"], DEBUG="1")
    assert off == {"CSRF_TRUSTED_ORIGINS": "[]", "USE_X_FORWARDED_HOST": "False", "SESSION_COOKIE_SECURE": "False",
                   "CSRF_COOKIE_SECURE": "False", "SECURE_SSL_REDIRECT": "False", "SECURE_HSTS_SECONDS": "0"}
    on = settings_of(tmp_path, PROXY_SETTINGS, DEBUG="1", CSRF_TRUSTED_ORIGINS="https://a.example, https://b.example:8443/",
                     SECURE_PROXY_SSL_HEADER="1", USE_X_FORWARDED_HOST="yes", SECURE_COOKIES="1",
                     SECURE_SSL_REDIRECT="on", SECURE_HSTS_SECONDS="3600")
    assert on == {"CSRF_TRUSTED_ORIGINS": "['https://a.example', 'https://b.example:8443']",
                  "SECURE_PROXY_SSL_HEADER": "('HTTP_X_FORWARDED_PROTO', 'https')", "USE_X_FORWARDED_HOST": "True",
                  "SESSION_COOKIE_SECURE": "True", "CSRF_COOKIE_SECURE": "True", "SECURE_SSL_REDIRECT": "True",
                  "SECURE_HSTS_SECONDS": "3600"}
