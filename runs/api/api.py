"""The NinjaAPI behind `/api/v1/` (OpenAPI at `/api/v1/openapi.json`, docs at `/api/v1/docs`)."""

from django.http import HttpResponseNotAllowed, JsonResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI

from runs.api import (
    answers,
    control,
    errors,
    views_budgets,
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

class AgentAPI(NinjaAPI):
    """NinjaAPI whose misses are JSON too: an unknown path under `/api/v1/` is a 404
    and a method the path lacks a 405 (with `Allow`), in the one error shape."""

    def _get_urls(self):
        patterns = super()._get_urls()
        for pattern in patterns:
            pattern.callback = _json_not_allowed(pattern.callback)
        return [*patterns, re_path(r"^.*$", _not_found, name="not-found")]


def _json(status, code, message):
    return JsonResponse({"error": {"code": code, "message": message, "fields": {}}}, status=status)


@csrf_exempt  # a POST to a wrong path is a JSON 404, not the CSRF page
def _not_found(request):
    return _json(404, "not_found", f"no such path: {request.path[:200]} (see /api/v1/openapi.json)")


def _json_not_allowed(view):
    import functools
    from inspect import iscoroutinefunction

    def convert(response):
        if isinstance(response, HttpResponseNotAllowed):
            allow = response["Allow"]
            response = _json(405, "method_not_allowed", f"this path answers {allow}")
            response["Allow"] = allow
        return response

    if iscoroutinefunction(view):
        @functools.wraps(view)
        async def async_wrapped(request, *args, **kwargs):
            return convert(await view(request, *args, **kwargs))

        return async_wrapped

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        return convert(view(request, *args, **kwargs))

    return wrapped


api = AgentAPI(
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
api.add_router("", views_budgets.router)
api.add_router("", answers.router)
