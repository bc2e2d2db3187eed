"""Revoking a key reaches what it has open: control sockets and long-polls.

Each of them joins its key's group on the channel layer; `revoke_key` announces the
revocation there after commit. The layer only wakes them: a long-poll re-reads the key
on every wake-up and every RECHECK_S, so a lost message delays the 401, never loses it.
"""

from runs import broadcast


def key_group(key_id):
    return f"apikey-{key_id}"


def announce_revoked(key_ids):
    broadcast.send_all([(key_group(key_id), {"type": "key.revoked", "key_id": key_id}) for key_id in key_ids])


def still_active(key):
    """Whether `key` (an ApiKey) is still unrevoked, read from the database."""
    from runs.models import ApiKey

    return ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).exists()
