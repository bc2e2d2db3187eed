"""Who is asking: the peer's address, or the one a trusted proxy forwarded.

X-Forwarded-For is believed only when the peer (REMOTE_ADDR) is a proxy listed in
RUNWARDEN_TRUSTED_PROXIES; then the client is the right-most address in the header
that is not itself a trusted proxy (left-most entries are whatever the client sent).
"""

import ipaddress

from django.conf import settings

FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def _address(value):
    try:
        return ipaddress.ip_address(value.strip().strip("[]"))
    except ValueError:
        return None


def _trusted(address):
    return address is not None and any(address in net for net in settings.RUNWARDEN_TRUSTED_PROXIES)


def forwarded(request):
    """Whether the request came through a proxy (carries a forwarding header)."""
    return any(request.META.get(header) for header in FORWARDING_HEADERS)


def client_ip(request):
    """The client's address as a string (login throttling; the audit's "from where")."""
    peer = request.META.get("REMOTE_ADDR", "")
    if not _trusted(_address(peer)):
        return peer
    hops = [h for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            return peer  # a garbled header: fall back to the proxy itself
        if not _trusted(address):
            return str(address)
    return peer
