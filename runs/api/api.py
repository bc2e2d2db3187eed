"""The NinjaAPI behind `/api/v1/` (OpenAPI at `/api/v1/openapi.json`, docs at `/api/v1/docs`)."""

from ninja import NinjaAPI

from runs.api import (
    control,
    errors,
    views_events,
    views_operator,
    views_runs,
    views_work,
)
from runs.api.auth import KeyAuth
from runs.api.parsing import StrictJSONParser

DESCRIPTION = """\
The agent API: agents in any language take runs, report progress, commit steps,
settle, and obey cancels. Authenticate with `Authorization: Bearer <key>` (keys come
from `manage.py runs apikey create NAME`). Errors are `{"error": {"code", "message",
"fields"}}`. Create, claim, steps and settle honour an `Idempotency-Key` header.
Control channel: WebSocket `/ws/agent/runs/{id}/`, or the long-poll below.
See docs/agent-api.md for the lifecycle an agent follows."""

api = NinjaAPI(
    title="Runwarden agent API",
    version="1",
    description=DESCRIPTION,
    auth=KeyAuth(),
    parser=StrictJSONParser(),
    urls_namespace="agent-api",
    docs_url="/docs",
)
errors.install(api)
# Order matters for URL resolution: "runs/claim" must come before "runs/<run_id>".
api.add_router("", views_runs.router)
api.add_router("", views_work.router)
api.add_router("", views_events.router)
api.add_router("", control.router)
api.add_router("", views_operator.router)
