"""API keys: minting, hashing, looking up, and who may touch which run.

A key is `rw_` + 43 URL-safe characters (256 random bits). Only its SHA-256 is
stored: a fast hash is enough for a random secret of that size (nothing to brute
force), and it lets a request find its key with one indexed lookup.

Scoping: a key acts as the worker `api:<name>`. An agent key may read and drive a
run only when that identity created it (`ApiRunCreator`) or holds/held it
(`Run.worker`); an operator key may also read any run, cancel it and retire it.
"""

import hashlib
import re
import secrets
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from ninja.security import HttpBearer

from runs.api.errors import ApiError
from runs.models import ApiKey, ApiRunCreator, Run

PREFIX = "rw_"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{10,128}$")
LAST_USED_EVERY = timedelta(minutes=1)  # write last_used_at at most this often per key


def hash_key(key):
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(name, scope=ApiKey.Scope.AGENT):
    """Mint a key for `name`; returns (ApiKey, the key in clear — shown once).
    Raises ValueError for a bad name or scope, or when an active key has that name."""
    if not NAME_RE.match(name or ""):
        raise ValueError("a key name is 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
    if scope not in ApiKey.Scope.values:
        raise ValueError(f"scope must be one of: {', '.join(ApiKey.Scope.values)}")
    key = PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        if ApiKey.objects.filter(name=name, revoked_at__isnull=True).exists():
            raise ValueError(f"an active key named {name!r} exists; revoke it first")
        record = ApiKey.objects.create(name=name, scope=scope, key_hash=hash_key(key), prefix=key[:10])
    return record, key


def revoke_key(name):
    """Revoke the active key named `name`; False when there is none."""
    return bool(ApiKey.objects.filter(name=name, revoked_at__isnull=True).update(revoked_at=timezone.now()))


def find_key(token):
    """The active ApiKey for a bearer token, or None (unknown, revoked or malformed)."""
    if not token or not token.startswith(PREFIX) or not TOKEN_RE.match(token[len(PREFIX):]):
        return None
    key = ApiKey.objects.filter(key_hash=hash_key(token), revoked_at__isnull=True).first()
    if key is not None and (key.last_used_at is None or timezone.now() - key.last_used_at > LAST_USED_EVERY):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    return key


def token_from_header(value):
    """The token of an `Authorization: Bearer <token>` header value, or None."""
    scheme, _, token = (value or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


class KeyAuth(HttpBearer):
    """ninja auth: `request.auth` becomes the ApiKey; a miss is a JSON 401."""

    def authenticate(self, request, token):
        return find_key(token.strip())


def run_for(key, run_id, *, only=None):
    """The run `key` may act on, or ApiError 404 (no such run) / 403 (another's run).

    An agent key sees runs its identity created or holds (or held); an operator key
    sees every run. This is a read for the error code only: every change is guarded
    again on the worker inside its transition."""
    from runs.transitions import parse_id

    parsed = parse_id(run_id)
    rows = Run.objects.filter(pk=parsed)
    if only:
        rows = rows.only(*only)
    run = rows.first() if parsed else None
    if run is None:
        raise ApiError(404, f"no run with id {str(run_id)[:64]!r}", code="run_not_found")
    if key.is_operator or run.worker == key.worker:
        return run
    if ApiRunCreator.objects.filter(run_id=run.pk, worker=key.worker).exists():
        return run
    raise ApiError(403, "this key may not act on that run: it neither created nor claimed it", code="not_your_run")


def require_operator(key):
    if not key.is_operator:
        raise ApiError(403, "this needs an operator key (runs apikey create NAME --scope operator)", code="operator_only")
