"""The WebSocket Origin check: the browser's Origin must be this site's own origin
(scheme, host and port, as the request reached us) or one of CSRF_TRUSTED_ORIGINS.

Channels' `OriginValidator` compares host names only, so a page on another port of the
same host (`http://127.0.0.1:9999`, any local service) could open a socket with the
operator's cookies and read run data. This compares all three parts, the way Django's
CSRF check compares an Origin with the request's own `scheme://host`:

- the request's scheme is `wss`/`ws` as daphne saw it, or `https` when
  SECURE_PROXY_SSL_HEADER is set and the proxy's header says so;
- its host is X-Forwarded-Host when USE_X_FORWARDED_HOST is on, else Host, and must be
  in ALLOWED_HOSTS;
- a trusted origin with a wildcard subdomain (`https://*.example`) covers subdomains of
  `example` on that scheme and port.
"""

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_origin(value):
    """(scheme, host, port) of an origin or None when it is not an http(s) origin."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]


def allowed_hosts():
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return ["localhost", "127.0.0.1", "[::1]"]
    return settings.ALLOWED_HOSTS


def _headers(scope):
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", ())}


def own_origin(scope):
    """The origin the request was made to, (scheme, host, port), or None when its
    host is not allowed."""
    headers = _headers(scope)
    secure = scope.get("scheme") in ("wss", "https")
    proxy_ssl = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_ssl:
        name, value = proxy_ssl
        header = headers.get(name.removeprefix("HTTP_").replace("_", "-").lower(), "")
        secure = header.split(",")[0].strip() == value
    host = headers.get("host", "")
    if settings.USE_X_FORWARDED_HOST and headers.get("x-forwarded-host"):
        host = headers["x-forwarded-host"].split(",")[0].strip()
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, allowed_hosts()):
        return None
    scheme = "https" if secure else "http"
    return parse_origin(f"{scheme}://{host}")


def trusted(origin):
    """Whether (scheme, host, port) is one of CSRF_TRUSTED_ORIGINS."""
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        scheme, _, netloc = entry.partition("://")
        wildcard = netloc.startswith("*.")
        parsed = parse_origin(f"{scheme}://{netloc[2:] if wildcard else netloc}")
        if parsed is None or parsed[0] != origin[0] or parsed[2] != origin[2]:
            continue
        if is_same_domain(origin[1], "." + parsed[1]) if wildcard else origin[1] == parsed[1]:
            return True
    return False


def origin_allowed(scope):
    origin = parse_origin(_headers(scope).get("origin", ""))
    if origin is None:
        return False
    return origin == own_origin(scope) or trusted(origin)


class OriginCheck:
    """ASGI middleware: a WebSocket whose Origin is not ours is refused before the
    handshake (HTTP 403: the page asking is not one of ours, there is nothing to tell it)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
