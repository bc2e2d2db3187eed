"""`Idempotency-Key`: a retried request gets the first answer, and does nothing again.

The change and the record of its answer are written in one transaction, so either
both exist or neither does. Two copies of one request racing: on PostgreSQL the
second blocks on the unique index until the first commits, then fails to insert its
record, rolls its own change back and replays the first answer; SQLite's IMMEDIATE
transactions serialise them, so the second finds the record at once.

Keys are scoped to the caller's identity and kept RETENTION long. A key reused with
a different method, path or body is refused (422), never silently replayed.
"""

import hashlib
import json
import random
from datetime import timedelta
from typing import Annotated

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone
from ninja import Header

from runs.api.errors import ApiError
from runs.models import IdempotencyRecord

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 200
RETENTION = timedelta(hours=24)
PURGE_CHANCE = 0.01  # purge expired records on ~1% of new ones: bounded, no cron needed
# Declared on the operations that honour it, for the OpenAPI schema; read from the request.
IdempotencyKey = Annotated[
    str | None,
    Header(alias=HEADER, description="a retry with the same key returns the first answer (kept 24 h)"),
]


def idempotent(request, owner, compute):
    """Run `compute() -> (status, body)` once per (owner, Idempotency-Key).

    Without the header, just runs it. A replay returns the stored (status, body) and
    marks the request `request.idempotent_replay = True`. An ApiError raised by
    `compute` is not recorded (its transaction rolls back): a retry runs again.
    """
    key = request.headers.get(HEADER)
    if key is None:
        return compute()
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not key.isascii() or not key.isprintable():
        raise ApiError(400, f"{HEADER} must be 1-{MAX_KEY_LENGTH} printable ASCII characters", code="bad_idempotency_key")
    fingerprint = _fingerprint(request)
    try:
        with transaction.atomic():
            stored = IdempotencyRecord.objects.filter(owner=owner, key=key).first()
            if stored is not None:
                return _replay(request, stored, fingerprint)
            status, body = compute()
            # Stored as JSON and returned as stored, so the first answer and a replay match.
            body = json.loads(json.dumps(body, cls=DjangoJSONEncoder))
            IdempotencyRecord.objects.create(
                owner=owner, key=key, fingerprint=fingerprint, status_code=status, response=body
            )
    except IntegrityError:
        # A concurrent copy committed first; our change was rolled back with this block.
        stored = IdempotencyRecord.objects.filter(owner=owner, key=key).first()
        if stored is None:
            raise
        return _replay(request, stored, fingerprint)
    if random.random() < PURGE_CHANCE:
        purge_expired()
    return status, body


def purge_expired(now=None):
    """Delete records older than RETENTION; returns how many."""
    cutoff = (now or timezone.now()) - RETENTION
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def _replay(request, stored, fingerprint):
    if stored.fingerprint != fingerprint:
        raise ApiError(
            422,
            f"this {HEADER} was used for a different request; use a new key for a new request",
            code="idempotency_key_reused",
        )
    request.idempotent_replay = True
    return stored.status_code, stored.response


def _fingerprint(request):
    digest = hashlib.sha256()
    for part in (request.method.encode(), request.path.encode(), request.body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
