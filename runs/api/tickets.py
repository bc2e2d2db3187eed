"""One-use control-socket tickets, for clients that cannot send headers on a WebSocket.

A browser's `new WebSocket()` takes no Authorization header, and a long-lived key in a
URL ends up in proxy logs and browser history. So a key asks for a ticket
(`POST /runs/{id}/ticket`) and the socket presents it (`?ticket=` or the subprotocol
`ticket.<ticket>`): good for one run, once, for TTL_S, stored hashed like keys.
"""

import secrets
from datetime import timedelta

from django.db.models.functions import Now
from django.utils import timezone

from runs.api.auth import hash_key
from runs.models import ApiTicket

PREFIX = "rwt_"
TTL_S = 60
SUBPROTOCOL = "runwarden"
SUBPROTOCOL_TICKET = "ticket."


def issue(key, run):
    """A new ticket for `key` on `run`: (ticket in clear, expires_at)."""
    ticket = PREFIX + secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(seconds=TTL_S)
    ApiTicket.objects.create(key=key, run=run, ticket_hash=hash_key(ticket), expires_at=expires_at)
    # Bounded without a cron: spent and expired tickets go as new ones are made.
    ApiTicket.objects.filter(expires_at__lt=Now() - timedelta(seconds=TTL_S)).delete()
    return ticket, expires_at


def redeem(ticket, run_id):
    """The ApiKey a ticket stands for, spending it; None when it is unknown, used,
    expired, for another run, or its key was revoked. One UPDATE decides, so two
    sockets racing with one ticket get one winner."""
    if not ticket or not ticket.startswith(PREFIX) or len(ticket) > 100 or run_id is None:
        return None
    rows = ApiTicket.objects.filter(
        ticket_hash=hash_key(ticket), run_id=run_id, used_at__isnull=True, expires_at__gt=Now(),
        key__revoked_at__isnull=True,
    )
    found = rows.values_list("pk", "key_id").first()
    if found is None or not ApiTicket.objects.filter(pk=found[0], used_at__isnull=True).update(used_at=Now()):
        return None
    from runs.models import ApiKey

    return ApiKey.objects.get(pk=found[1])


def from_scope(scope):
    """(ticket or None, the subprotocol to select or None) from a socket's handshake."""
    from urllib.parse import parse_qs

    query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
    offered = [p.strip() for p in scope.get("subprotocols") or ()]
    for protocol in offered:
        if protocol.startswith(SUBPROTOCOL_TICKET):
            # A browser fails a socket whose server selects none of its offers.
            return protocol[len(SUBPROTOCOL_TICKET):], SUBPROTOCOL if SUBPROTOCOL in offered else protocol
    values = query.get("ticket") or [None]
    return values[0], SUBPROTOCOL if SUBPROTOCOL in offered else None
