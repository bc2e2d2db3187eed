"""The settings file `make run` writes (`var/runwarden.env`), so that `manage.py …` in
the same checkout works as the README writes it, with no variables to export.

Precedence: the environment first; the file only fills in variables the environment
does not set (set to anything, even empty, counts as set). Lines are `NAME=value`;
blank lines and `#` comments are skipped; no quoting, no expansion.

`python -m dashboard.envfile PATH` creates the file once (DEBUG=1 and a generated
SECRET_KEY) and leaves an existing one alone.
"""

import os
import secrets
import sys
from pathlib import Path

from dashboard.env import ConfigError


def read(path):
    """The file's variables as a dict; {} when it does not exist."""
    path = Path(path)
    if not path.exists():
        return {}
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip().isidentifier():
            raise ConfigError(f"{path}:{number}: expected NAME=value, got {line!r}")
        values[name.strip()] = value.strip()
    return values


def load(path):
    """Put the file's variables into os.environ where the environment has none."""
    for name, value in read(path).items():
        os.environ.setdefault(name, value)


def create(path):
    """Write the development settings once; True when the file was created."""
    path = Path(path)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        "# Written once by `make run`: development settings for this checkout.\n"
        "# The environment wins over this file; delete it to start again.\n"
        "DEBUG=1\n"
        f"SECRET_KEY={secrets.token_urlsafe(50)}\n"
    )
    # Owner-only: it holds a secret key.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    return True


if __name__ == "__main__":
    target = sys.argv[1]
    if create(target):
        print(f"Wrote development settings to {target}")
