"""One error shape for every failure: `{"error": {"code", "message", "fields"}}`.

Handlers are installed on the NinjaAPI so that validation errors, malformed or
oversized bodies, missing keys and database range errors all answer in that shape
with a 4xx; nothing a client sends should reach the generic 500 handler.
"""

import logging

from django.core.exceptions import RequestDataTooBig
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404
from ninja.errors import AuthenticationError, HttpError, ValidationError

log = logging.getLogger("runs.api")

CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
         405: "method_not_allowed", 409: "conflict", 413: "too_large", 422: "invalid", 429: "throttled"}


class ApiError(Exception):
    """An answer other than success: raised anywhere in a view, rendered by `install`.

    `extra` adds top-level keys next to "error" (a 409 carries the outcome that stands);
    `headers` are set on the response (a 429's Retry-After).
    """

    def __init__(self, status, message, *, code=None, fields=None, extra=None, headers=None):
        super().__init__(message)
        self.status = status
        self.code = code or CODES.get(status, "error")
        self.message = message
        self.fields = fields or {}
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self):
        return {"error": {"code": self.code, "message": self.message, "fields": self.fields}, **self.extra}


def error_body(status, message, *, code=None, fields=None):
    return ApiError(status, message, code=code, fields=fields).body()


def agent_capped(agent, capped, retry_after=None):
    """429 `agent_budget_exhausted`: `agent` reached a 24 h cap (`capped`, a
    runs.agent_caps.Capped); Retry-After when the window's runs tell when it frees."""
    return ApiError(
        429, f"{agent}: {capped.reason}; its runs stay queued until its 24 h spend falls below the cap",
        code="agent_budget_exhausted", fields={"agent": capped.reason}, extra={"limit": capped.limit},
        headers={"Retry-After": str(retry_after)} if retry_after else None,
    )


def too_large(message):
    return ApiError(413, message, code="too_large")


def install(api):
    """Register the exception handlers on `api` (a NinjaAPI)."""

    def respond(request, error):
        response = api.create_response(request, error.body(), status=error.status)
        for name, value in error.headers.items():
            response[name] = value
        if error.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="runwarden"'
        return response

    @api.exception_handler(ApiError)
    def on_api_error(request, exc):
        return respond(request, exc)

    @api.exception_handler(ValidationError)
    def on_validation(request, exc):
        return respond(request, ApiError(422, "the request does not match the schema", fields=_fields(exc.errors)))

    @api.exception_handler(AuthenticationError)
    def on_auth(request, exc):
        return respond(request, ApiError(401, "a valid key is required: Authorization: Bearer <key>"))

    @api.exception_handler(HttpError)
    def on_http_error(request, exc):
        # ninja wraps whatever the body parser raised in a 400; keep ours (e.g. a 413).
        if isinstance(exc.__cause__, ApiError):
            return respond(request, exc.__cause__)
        return respond(request, ApiError(exc.status_code, str(exc)))

    @api.exception_handler(Http404)
    def on_404(request, exc):
        return respond(request, ApiError(404, "no such resource"))

    @api.exception_handler(RequestDataTooBig)
    def on_too_big(request, exc):
        return respond(request, too_large("the request body is larger than 1 MiB"))

    @api.exception_handler(DataError)
    def on_data_error(request, exc):
        # A value the database cannot hold (a total past its column's range, say).
        log.info("agent API: database refused a value: %s", exc)
        return respond(request, ApiError(422, "a value is out of the range the database can store", code="out_of_range"))

    @api.exception_handler(OperationalError)
    @api.exception_handler(InterfaceError)
    def on_outage(request, exc):
        # A database outage is not a bug: let it through to the server's outage handling
        # (dashboard.outage answers 503 `database_unavailable` with Retry-After).
        raise exc

    @api.exception_handler(Exception)
    def on_bug(request, exc):
        log.exception("agent API: unexpected error on %s %s", request.method, request.path)
        return respond(request, ApiError(500, "internal error; see the server log", code="internal"))


def _fields(errors):
    """pydantic's error list as {"dotted.location": "message"}, without the parameter
    wrapper ninja adds ("body", "payload")."""
    fields = {}
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        if len(loc) >= 2 and loc[0] == "body":
            loc = loc[2:] or ["body"]
        fields[".".join(loc) or "body"] = error.get("msg", "invalid")
    return fields
