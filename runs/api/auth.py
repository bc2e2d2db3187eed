"""API keys: minting, hashing, looking up, and who may touch which run.

A key is `rw_` + 43 URL-safe characters (256 random bits). Only its SHA-256 is
stored: a fast hash is enough for a random secret of that size (nothing to brute
force), and it lets a request find its key with one indexed lookup.

Scoping: a key acts as the worker `api:<name>`. An agent key may read and drive a
run only when that identity created it (`ApiRunCreator`) or holds/held it
(`Run.worker`); an operator key may also read any run, cancel it and retire it.
An agent key creates and claims runs only of the agent names it carries (`may_run`).
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


ANY_AGENT = "*"
AGENT_NAME_RE = re.compile(r"^[^\s,]{1,100}$")


def engine_agents():
    """The built-in engine's agent names: they run on the server's own provider key."""
    from runs.agent.providers import AGENTS

    return AGENTS


def clean_agents(agents):
    """A key's agent list from names (or one comma-separated string); ValueError if bad."""
    if isinstance(agents, str):
        agents = agents.split(",")
    names = [name.strip() for name in agents or () if name.strip()]
    for name in names:
        if not AGENT_NAME_RE.match(name):
            raise ValueError(f"bad agent name {name[:40]!r}: 1-100 characters, no spaces or commas")
    return sorted(set(names))


def create_key(name, scope=ApiKey.Scope.AGENT, agents=(ANY_AGENT,)):
    """Mint a key for `name`; returns (ApiKey, the key in clear — shown once).
    `agents`: the agent names an agent key may create and claim ("*": any but the
    engine's). Raises ValueError for a bad name, scope or agent list, or when an active
    key has that name."""
    if not NAME_RE.match(name or ""):
        raise ValueError("a key name is 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
    if scope not in ApiKey.Scope.values:
        raise ValueError(f"scope must be one of: {', '.join(ApiKey.Scope.values)}")
    agents = clean_agents(agents)
    if scope == ApiKey.Scope.AGENT and not agents:
        raise ValueError("an agent key needs the agent names it may run: --agents NAME[,NAME…] ('*': any but the engine's)")
    key = PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        if ApiKey.objects.filter(name=name, revoked_at__isnull=True).exists():
            raise ValueError(f"an active key named {name!r} exists; revoke it first")
        record = ApiKey.objects.create(
            name=name, scope=scope, key_hash=hash_key(key), prefix=key[:10], agents=agents
        )
    return record, key


def set_agents(name, agents):
    """Replace the agent list of the active key `name`; False when there is none."""
    agents = clean_agents(agents)
    if not agents:
        raise ValueError("give at least one agent name ('*': any but the engine's)")
    return bool(ApiKey.objects.filter(name=name, revoked_at__isnull=True).update(agents=agents))


def may_run(key, agent):
    """Whether `key` may create and claim runs of `agent`. Operator keys: any."""
    if key.is_operator or agent in (key.agents or ()):
        return True
    return ANY_AGENT in (key.agents or ()) and agent not in engine_agents()


def require_agents(key, agents):
    """ApiError 403 `agent_not_allowed` unless `key` may run every one of `agents`."""
    refused = [agent for agent in agents if not may_run(key, agent)]
    if refused:
        raise ApiError(
            403, f"this key may not run agent {refused[0]!r}: see `runs apikey agents`",
            code="agent_not_allowed", fields={"agent": ", ".join(refused)[:200]},
        )


def revoke_key(name):
    """Revoke the active key named `name`; False when there is none. Its open control
    sockets are closed and its long-polls answer 401 (`runs.api.revocation`)."""
    from runs.api.revocation import announce_revoked

    with transaction.atomic():
        ids = list(ApiKey.objects.filter(name=name, revoked_at__isnull=True).values_list("pk", flat=True))
        if not ids or not ApiKey.objects.filter(pk__in=ids).update(revoked_at=timezone.now()):
            return False
        transaction.on_commit(lambda: announce_revoked(ids))
    return True


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


RUN_FIELDS_FOR_ACCESS = ("id", "status", "worker", "cancel_requested_at", "cancel_source", "cancel_note", "steps")


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
