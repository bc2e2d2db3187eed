"""Read configuration from the environment; a wrong value is a one-line ConfigError.

`manage.py` and `asgi.py` turn a ConfigError into a single line on stderr naming the
variable, instead of a traceback, so an operator sees at once what to fix.
"""

import os
from urllib.parse import urlsplit

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


class ConfigError(Exception):
    """A setting read from the environment has a value we cannot use."""


def boolean(name, default=False):
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def number(name, default, *, minimum=0.0, cast=float):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum}")
    return value


def url(name, default, *, schemes):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    parts = urlsplit(raw.strip())
    if parts.scheme not in schemes:
        allowed = ", ".join(sorted(schemes))
        raise ConfigError(f"{name}={raw!r} has scheme {parts.scheme!r}; expected one of: {allowed}")
    return raw.strip()


def hosts(name, default):
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    values = [h.strip() for h in raw.split(",") if h.strip()]
    if not values:
        raise ConfigError(f"{name} is empty; give a comma-separated list of host names")
    return values


def networks(name, default):
    """A comma-separated list of addresses or CIDR networks."""
    import ipaddress

    raw = os.environ.get(name)
    values = default if raw is None else [v.strip() for v in raw.split(",") if v.strip()]
    try:
        return [ipaddress.ip_network(v, strict=False) for v in values]
    except ValueError as error:
        raise ConfigError(f"{name}={raw!r}: {error}") from None


def choice(name, default, choices):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={raw!r} is not one of: {', '.join(sorted(choices))}")
    return value


def origins(name):
    """A comma-separated list of origins (`https://host[:port]`), as CSRF_TRUSTED_ORIGINS
    wants them: a scheme and a host, no path."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return []
    values = [v.strip().rstrip("/") for v in raw.split(",") if v.strip()]
    for value in values:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
            raise ConfigError(f"{name}: {value!r} is not an origin like https://runwarden.example")
    return values


def channel_prefix(database):
    """The default channel-layer prefix: `rw_` + a short hash of where the deployment's
    database lives (host, port, name), so two deployments sharing one Redis (whose
    pub/sub ignores the DB number) do not hear each other, and every process of one
    deployment (servers, workers, watchdog) agrees without being told."""
    import hashlib

    where = f"{database.get('ENGINE', '')}|{database.get('HOST') or ''}|{database.get('PORT') or ''}|{database.get('NAME') or ''}"
    return "rw_" + hashlib.sha256(where.encode()).hexdigest()[:12]
