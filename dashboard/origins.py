"""The WebSocket Origin check: ALLOWED_HOSTS (any scheme, as Channels' own validator
allows them) plus the proxy's public origins in CSRF_TRUSTED_ORIGINS, so a browser on
https://runwarden.example is accepted when the proxy forwards a private Host."""

from urllib.parse import urlsplit

from channels.security.websocket import OriginValidator
from django.conf import settings


def allowed_origins():
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    # OriginValidator takes "scheme://host[:port]" patterns; a trusted origin with a
    # wildcard subdomain (https://*.example) becomes ".example" for the same meaning.
    for origin in settings.CSRF_TRUSTED_ORIGINS:
        parts = urlsplit(origin)
        if parts.netloc.startswith("*."):
            allowed.append(f"{parts.scheme}://{parts.netloc[1:]}")
        else:
            allowed.append(origin)
    return allowed


def OriginCheck(application):
    return OriginValidator(application, allowed_origins())
