"""The settings file `make run` writes: `manage.py runs …` works in the checkout
afterwards with nothing exported, and the environment still wins."""

import os
import stat
import subprocess
import sys

from django.conf import settings

from dashboard import envfile


def clean_env(tmp_path, env_file, **extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    env.update({"RUNWARDEN_ENV_FILE": str(env_file), "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", **extra})
    return env


def run(args, env):
    return subprocess.run([sys.executable, *args], cwd=settings.BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=120)


def test_created_once_with_debug_and_a_secret_key(tmp_path):
    path = tmp_path / "var" / "runwarden.env"
    assert envfile.create(path)
    first = path.read_text()
    assert not envfile.create(path)  # a second `make run` keeps the key (and sessions)
    assert path.read_text() == first
    values = envfile.read(path)
    assert values["DEBUG"] == "1" and len(values["SECRET_KEY"]) >= 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_cli_works_with_nothing_exported_after_make_run_writes_the_file(tmp_path):
    env_file = tmp_path / "runwarden.env"
    done = run(["-m", "dashboard.envfile", str(env_file)], clean_env(tmp_path, env_file))
    assert done.returncode == 0 and env_file.exists(), done.stderr
    env = clean_env(tmp_path, env_file)
    assert run(["manage.py", "migrate", "--noinput"], env).returncode == 0
    listed = run(["manage.py", "runs", "list"], env)
    assert listed.returncode == 0, listed.stderr
    assert "SECRET_KEY" not in listed.stderr


def test_without_the_file_the_cli_says_what_is_missing(tmp_path):
    """The test above can fail: the same command without the file."""
    listed = run(["manage.py", "runs", "list"], clean_env(tmp_path, tmp_path / "missing.env"))
    assert listed.returncode != 0
    assert "SECRET_KEY is required unless DEBUG=1" in listed.stderr


def test_the_environment_wins_over_the_file(tmp_path):
    env_file = tmp_path / "runwarden.env"
    env_file.write_text("# comment\n\nDEBUG=1\nSECRET_KEY=from-the-file\nALLOWED_HOSTS=file.example\n")
    code = "from django.conf import settings; print(settings.DEBUG, settings.SECRET_KEY, settings.ALLOWED_HOSTS)"
    env = clean_env(tmp_path, env_file, DJANGO_SETTINGS_MODULE="dashboard.settings")
    assert run(["-c", code], env).stdout.split() == ["True", "from-the-file", "['file.example']"]
    env.update({"DEBUG": "0", "SECRET_KEY": "from-the-environment"})
    assert run(["-c", code], env).stdout.split() == ["False", "from-the-environment", "['file.example']"]


def test_a_garbled_line_is_one_line_naming_the_file(tmp_path):
    env_file = tmp_path / "runwarden.env"
    env_file.write_text("DEBUG 1\n")
    done = run(["manage.py", "check"], clean_env(tmp_path, env_file))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{env_file}:1: expected NAME=value" in lines[0], done.stderr
