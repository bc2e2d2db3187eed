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
